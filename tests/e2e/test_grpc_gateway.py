"""detok as the gateway to a gRPC engine (`detok serve --source grpc`): real processes, real gRPC and ZeroMQ
sockets. The engine is `detok engine-server` on the echo source (the output is the prompt's ids, then EOS), so
every expected text is known; it counts the aborts it gets."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import grpc
import pytest
from helpers.fault_helpers import (
    EchoCase,
    Outcome,
    bounded,
    complete,
    echo_cases,
    http_client,
    reference,
    stream_completion,
)
from helpers.grpc_engine_server import EngineServer, engine_server
from helpers.serve_helpers import REPO, ServeProcess, serving, wait_for
from smg_grpc_proto import vllm_engine_pb2 as pb2
from smg_grpc_proto import vllm_engine_pb2_grpc as pb2_grpc

from engine_stub.planned import load_corpus

STEP_MS = "4"  # the engine server's pace: long prompts are still generating when a stop or a disconnect comes


def gateway(engine: EngineServer, *extra: str) -> AbstractContextManager[ServeProcess]:
    return serving(
        "--workers", "2", "--source", "grpc", "--engine-url", engine.url, *extra,
        "--set", "worker.stats_interval_s=0.1", "--set", "engine.stats_interval_s=0.1",
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineServer]:
    with engine_server("--source", "echo", "--step-interval-ms", STEP_MS) as server:
        yield server


@pytest.fixture(scope="module")
def service(engine: EngineServer) -> Iterator[ServeProcess]:
    with gateway(engine) as serve:
        yield serve


def long_prompt(tokens: int) -> str:
    passages = load_corpus()
    return "\n".join(passages[i % len(passages)] for i in range(tokens // 40 + 1))


def visible_reference(tokenizer: object, case: EchoCase) -> tuple[str, str]:
    """With include_stop_str_in_output the text runs to the end of the first stop string match."""
    text, finish = reference(tokenizer, EchoCase(case.ids, [], case.max_tokens))
    matches = [(text.find(s) + len(s), text.find(s)) for s in case.stop if s in text]
    return (text[: min(matches)[0]], "stop") if matches else (text, finish)


def test_50_concurrent_streams_are_exact_with_hidden_and_visible_stop_strings(service, engine, qwen3):
    cases = echo_cases(qwen3, 50, seed=13)
    visible = [index % 2 == 1 for index in range(len(cases))]

    async def run() -> list[Outcome]:
        async with http_client(service) as client:
            pairs = zip(cases, visible, strict=True)
            bodies = [{**case.body(True), "include_stop_str_in_output": show} for case, show in pairs]
            return await asyncio.gather(*(bounded(stream_completion(client, body)) for body in bodies))

    outcomes = asyncio.run(run())
    for case, show, outcome in zip(cases, visible, outcomes, strict=True):
        text, finish = visible_reference(qwen3, case) if show else reference(qwen3, case)
        assert outcome.status == 200 and outcome.error is None, outcome
        assert outcome.text == text, (case, show)
        assert outcome.finish_reason == finish
    assert sum(1 for case in cases if case.stop) > 20  # the stop strings really were exercised
    assert engine.count("requests") >= 50


def test_a_stop_string_found_by_a_worker_aborts_the_engine_request(service, engine, qwen3):
    prompt = long_prompt(600)  # ~600 tokens at 4 ms: generating for seconds
    stop = prompt[30:36]
    aborted_before = engine.count("aborted")

    async def run() -> Outcome:
        async with http_client(service) as client:
            return await bounded(stream_completion(client, {"prompt": prompt, "max_tokens": 4000, "stop": [stop]}))

    outcome = asyncio.run(run())
    assert outcome.text == prompt[: prompt.index(stop)] and outcome.finish_reason == "stop"
    wait_for(lambda: engine.count("aborted") > aborted_before, 10, what="the engine server to count the abort")
    # the gateway aborts, then drops the stream: the engine server's Generate ends a moment after its abort count
    wait_for(lambda: engine.count("running") == 0, 5, what="the engine server to stop generating")


def test_a_client_disconnect_aborts_the_engine_request_within_1s(service, engine):
    prompt = long_prompt(2000)
    aborted_before = engine.count("aborted")

    async def read_a_little_then_leave() -> str:
        async with (
            http_client(service) as client,
            client.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 4000, "stream": True}) as r,
        ):
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    return line
        return ""

    assert asyncio.run(bounded(read_a_little_then_leave())).startswith("data: ")
    wait_for(lambda: engine.count("aborted") > aborted_before, 1.0, what="the engine server to count the abort")
    wait_for(lambda: engine.count("running") == 0, 5, what="the engine server to stop generating")


def test_engine_down_mid_stream_fails_every_open_request_then_serves_again(qwen3):
    engine = EngineServer("--source", "echo", "--step-interval-ms", "10")
    try:
        with gateway(engine) as service:
            prompt = long_prompt(1000)  # ~10 s of generation: all still open when the engine dies

            async def streams_while_engine_dies() -> list[Outcome]:
                async with http_client(service) as client:
                    body = {"prompt": prompt, "max_tokens": 4000}
                    tasks = [asyncio.create_task(bounded(stream_completion(client, body))) for _ in range(8)]
                    while engine.count("running") < 8:
                        await asyncio.sleep(0.05)
                    engine.kill()
                    return await asyncio.gather(*tasks)

            for outcome in asyncio.run(streams_while_engine_dies()):
                assert outcome.error is not None, outcome
                assert engine.url in outcome.error["message"]
                assert prompt.startswith(outcome.text)

            async def one(text: str) -> Outcome:
                async with http_client(service) as client:
                    return await bounded(complete(client, {"prompt": text, "max_tokens": 50}))

            down = asyncio.run(one("while the engine is down"))
            assert down.status == 503 and engine.url in down.error["message"]
            engine.start()  # same port
            text = "The engine is back."
            wait_for(lambda: asyncio.run(one(text)).text == text, 30, interval=0.2, what="detok to serve again")
    finally:
        engine.cleanup()


def test_a_stream_the_engine_cancels_at_start_is_opened_again_up_to_the_retry_limit(qwen3):
    engine = EngineServer("--source", "echo", "--cancel-starts", "4")
    try:
        with gateway(engine, "--set", "engine.start_retries=2") as service:

            async def one(text: str) -> Outcome:
                async with http_client(service) as client:
                    return await bounded(complete(client, {"prompt": text, "max_tokens": 50}))

            first = asyncio.run(one("Cancelled three times."))  # 1 + 2 retries, all cancelled: the client hears
            assert first.status == 503, first
            assert engine.url in first.error["message"] and "CANCELLED" in first.error["message"]
            wait_for(lambda: engine.count("cancelled_starts") == 3, 30, what="the engine server's count")
            text = "Cancelled once, then served."
            second = asyncio.run(one(text))  # the echo source returns the prompt: exact text after one retry
            assert (second.status, second.text, second.finish_reason) == (200, text, "stop")
            wait_for(lambda: engine.stats().get("cancelled_starts") == 4 and engine.count("completed") == 1, 30,
                     what="the engine server's counts")  # fmt: skip
    finally:
        engine.cleanup()


def run_engine_command(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="detok-test-xdg-") as xdg:
        return subprocess.run(
            [sys.executable, "-m", "detok_worker.cli", "engine", "--source", "grpc", "--engine-url", url, *extra],
            cwd=REPO,
            env=dict(os.environ, XDG_RUNTIME_DIR=xdg),
            capture_output=True,
            text=True,
            timeout=120,
        )


def test_the_engine_server_refuses_more_logprobs_than_vllm_allows_and_serves_on(engine):
    """As vLLM's max_logprobs (20): a gRPC client asking for 10**9 gets INVALID_ARGUMENT at once (the stub's fake
    logprobs cost O(asked) per token and stalled its loop before), and the next request is served."""
    with grpc.insecure_channel(engine.url.removeprefix("grpc://")) as channel:
        stub = pb2_grpc.VllmEngineStub(channel)

        def generate(rid: str, logprobs: int) -> list[Any]:
            sampling = pb2.SamplingParams(max_tokens=4, logprobs=logprobs, ignore_eos=True)
            request = pb2.GenerateRequest(
                request_id=rid, tokenized=pb2.TokenizedInput(input_ids=[9707, 11, 1879]), sampling_params=sampling
            )
            return list(stub.Generate(request, timeout=30))

        with pytest.raises(grpc.RpcError) as refused:
            generate("too-many-logprobs", 10**9)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "logprobs must be at most 20" in refused.value.details()
        responses = generate("twenty-logprobs", 20)
        chunks = [r.chunk for r in responses if r.WhichOneof("response") == "chunk"]
        assert sum(len(chunk.token_ids) for chunk in chunks) == 4
        tops = [top for chunk in chunks for top in chunk.output_logprobs.top_logprobs]
        assert len(tops) == 4 and all(len(top.token_ids) == 20 for top in tops)


def test_an_engine_with_another_tokenizer_is_refused_at_start_up():
    engine = EngineServer("--source", "echo", "--tokenizer", str(REPO / "tests/fixtures/tokenizers/deepseek-v3"))
    try:
        result = run_engine_command(engine.url)
    finally:
        engine.cleanup()
    assert result.returncode == 1
    assert f"the gRPC engine at {engine.url} serves another tokenizer" in result.stderr


def test_an_engine_that_is_down_is_refused_at_start_up_naming_its_url():
    engine = EngineServer("--source", "echo")
    url = engine.url
    engine.cleanup()  # nothing listens there any more
    result = run_engine_command(url, "--set", "engine.connect_timeout_s=1")
    assert result.returncode == 1
    assert f"no gRPC engine answers at {url}" in result.stderr
