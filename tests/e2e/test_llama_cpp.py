"""A real model through a real `detok serve --source llama-cpp`: SmolLM2-135M-Instruct generates greedily (the same
ids on every run), step by step, interleaved over the running requests; detok's workers turn the ids into text, the
front streams it. Each client's text equals llama.cpp's own detokenization of the ids a plain llama.cpp generation
gives in this process, cut by stop strings taken from that text (hidden and visible); usage counts the ids.
Generating must not cost a worker its place. Streaming is real: a client that leaves after its first chunk, and a
stop string found early, end the generation long before max_tokens (the engine's count of generated ids says so).
The same through the gRPC path: `detok serve --source grpc` -> `detok engine-server --source llama-cpp`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from helpers.grpc_engine_server import EngineServer
from helpers.llama_oracle import greedy_ids, llama_detokenize, smollm2
from helpers.serve_helpers import ServeProcess, http_json, serving, sse_payloads, wait_for

from detok_worker.tokenizer import create_tokenizer
from engine_stub.llama import default_model_path

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
PROMPTS = [
    [SYSTEM, {"role": "user", "content": "Write a haiku about the sea."}],
    [SYSTEM, {"role": "user", "content": "Translate 'good morning' into Chinese, Japanese and Korean."}],
    [{"role": "user", "content": "Reply with three emoji about cats."}],
    [{"role": "user", "content": "Name three primes."}],
]
MAX_TOKENS = 32
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]  # greedy: no end within 64 ids
STORY_TOKENS = 64


@dataclass(frozen=True)
class Case:
    messages: list[dict[str, str]]
    stop: str | None = None
    visible: bool = False

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages,
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.stop is not None:
            body["stop"] = [self.stop]
            body["include_stop_str_in_output"] = self.visible
        return body


@dataclass
class Streamed:
    text: str
    finish_reason: str | None
    completion_tokens: int | None


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    args = ("--tokenizer", str(default_model_path()), "--source", "llama-cpp", "--step-interval-ms", "2",
            "--set", "engine.stats_interval_s=0.1")  # fmt: skip
    with serving(*args) as serve:
        yield serve


def _prompt_ids(messages: list[dict[str, str]]) -> list[int]:
    """The prompt ids the front sends (detok's tokenizer renders and encodes the prompt; test_tokenizer_gguf_smollm2
    checks those ids are llama.cpp's)."""
    tokenizer = create_tokenizer(str(default_model_path()))
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)).ids


@pytest.fixture(scope="module")
def generated() -> list[list[int]]:
    """The ids the service's source generates for each prompt."""
    return [greedy_ids(_prompt_ids(messages), MAX_TOKENS) for messages in PROMPTS]


@pytest.fixture(scope="module")
def story() -> list[int]:
    ids = greedy_ids(_prompt_ids(STORY), STORY_TOKENS)
    assert len(ids) == STORY_TOKENS and not smollm2().end_of_generation_ids & set(ids)
    return ids


def _model(url: str) -> str:
    status, models = http_json(f"{url}/v1/models")
    assert status == 200
    return models["data"][0]["id"]


def _stop_in(text: str) -> str:
    """A stop string that occurs in `text`: five characters from its second half, not all whitespace."""
    start = len(text) // 2
    while not text[start : start + 5].strip():
        start += 1
    return text[start : start + 5]


def _expected(case: Case, ids: list[int]) -> Streamed:
    text = llama_detokenize(ids, special=False)
    ended_by_model = ids[-1] in smollm2().end_of_generation_ids
    if case.stop is None:
        return Streamed(text, "stop" if ended_by_model else "length", len(ids))
    cut = text.find(case.stop) + (len(case.stop) if case.visible else 0)
    return Streamed(text[:cut], "stop", None)


async def _stream_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> Streamed:
    parts: list[str] = []
    streamed = Streamed("", None, None)
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for event in sse_payloads(response.aiter_lines()):
            assert "error" not in event, event
            if event.get("usage"):
                streamed.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event["choices"]:
                parts.append(choice["delta"].get("content") or "")
                streamed.finish_reason = choice.get("finish_reason") or streamed.finish_reason
    streamed.text = "".join(parts)
    return streamed


async def _run_all(service: ServeProcess, bodies: list[dict[str, Any]]) -> list[Streamed]:
    async with httpx.AsyncClient(base_url=service.url, timeout=120) as client:
        return await asyncio.gather(*(_stream_chat(client, body) for body in bodies))


def test_streamed_text_is_llama_cpp_detokenization_with_real_stop_strings(
    service: ServeProcess, generated: list[list[int]]
) -> None:
    assert all(len(ids) >= 5 for ids in generated)
    cases: list[tuple[Case, list[int]]] = []
    for number, (messages, ids) in enumerate(zip(PROMPTS, generated, strict=True)):
        stop = _stop_in(llama_detokenize(ids, special=False))
        cases += [(Case(messages), ids), (Case(messages, stop, visible=number % 2 == 1), ids)]
    model = _model(service.url)
    pids_before = {worker["pid"] for worker in service.stats()["workers"].values()}

    results = asyncio.run(_run_all(service, [case.body(model) for case, _ in cases]))

    for (case, ids), streamed in zip(cases, results, strict=True):
        expected = _expected(case, ids)
        assert streamed.text == expected.text, (case.messages[-1]["content"], case.stop, case.visible)
        assert streamed.finish_reason == expected.finish_reason
        if expected.completion_tokens is not None:
            assert streamed.completion_tokens == expected.completion_tokens
    assert any(ids[-1] not in smollm2().end_of_generation_ids for ids in generated)  # some end by max_tokens
    stats = service.stats()
    assert len(stats["engine"]["workers"]) == 2
    assert stats["engine"]["reopened"] == 0
    assert {worker["pid"] for worker in stats["workers"].values()} == pids_before
    assert "missed its heartbeats" not in service.log(tail=None)


def _idle_generated(service: ServeProcess) -> int:
    """The engine's count of generated ids once no request is live (and the count has settled)."""

    def settled() -> int | None:
        engine = service.stats()["engine"]
        return engine["generated"] + 1 if engine["live_rids"] == 0 else None

    return wait_for(settled, 30, what="no live request in the engine") - 1


async def _first_chunk_then_leave(url: str, body: dict[str, Any]) -> str:
    """Stream until the first text arrives, then drop the connection (the front aborts the request)."""
    async with (
        httpx.AsyncClient(base_url=url, timeout=120) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[len("data: ") :])["choices"]:
                    if choice["delta"].get("content"):
                        return choice["delta"]["content"]
    raise AssertionError("the stream ended without text")


def test_ids_stream_as_generated_and_a_leaving_client_or_a_stop_string_ends_generation(
    service: ServeProcess, story: list[int]
) -> None:
    model = _model(service.url)
    text = llama_detokenize(story, special=False)
    body = {"model": model, "messages": STORY, "max_tokens": STORY_TOKENS, "stream": True}

    before = _idle_generated(service)
    first = asyncio.run(_first_chunk_then_leave(service.url, body))
    left = _idle_generated(service) - before
    assert text.startswith(first)
    assert 0 < left < STORY_TOKENS  # the first chunk left before the last id was made, and generation stopped

    stop = text[len(text) // 5 :][:6]  # early in the story: generation must stop well before STORY_TOKENS
    assert stop.strip() and stop in text
    before = _idle_generated(service)
    streamed = asyncio.run(_run_all(service, [{**body, "stop": [stop]}]))[0]
    stopped = _idle_generated(service) - before
    assert streamed.text == text[: text.index(stop)] and streamed.finish_reason == "stop"
    assert stopped < STORY_TOKENS
    assert "missed its heartbeats" not in service.log(tail=None)


def test_grpc_gateway_to_a_llama_cpp_engine_server_streams_exact_text(story: list[int]) -> None:
    gguf = str(default_model_path())
    engine = EngineServer("--tokenizer", gguf, "--source", "llama-cpp", "--step-interval-ms", "2")
    try:
        with serving("--workers", "1", "--tokenizer", gguf, "--source", "grpc", "--engine-url", engine.url) as serve:
            model = _model(serve.url)
            text = llama_detokenize(story, special=False)
            stop = text[len(text) // 5 :][:6]
            body = {"model": model, "messages": STORY, "max_tokens": STORY_TOKENS, "stream": True}
            short = {**body, "max_tokens": 12}
            plain, stopped = asyncio.run(_run_all(serve, [short, {**body, "stop": [stop]}]))
            # the worker's stop makes the gateway abort the engine's request
            wait_for(lambda: engine.count("aborted") == 1, 10, what="the engine server to count the abort")
        engine.stop()
        counts = engine.stats()
    finally:
        engine.cleanup()
    assert plain.text == llama_detokenize(story[:12], special=False) and plain.finish_reason == "length"
    assert stopped.text == text[: text.index(stop)] and stopped.finish_reason == "stop"
    assert counts["requests"] == 2 and counts["aborted"] == 1 and counts["completed"] == 1
    assert counts["generated"] < 12 + STORY_TOKENS  # the aborted request stopped generating
