"""`detok serve --source grpc` as a relay in front of an engine that schedules itself: no admission cap of ours (300
streams whose clients never read do not hold a normal client back), refusals known at admission answered with
their HTTP status (never a 200 and then an error event), and the engine's served model name. Real processes: `detok
engine-server` on the echo source (the output is the prompt's ids, then EOS) behind a real `detok serve`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from helpers import fault_helpers as faults
from helpers.fault_helpers import EchoCase, Outcome, bounded, reference
from helpers.grpc_engine_server import EngineServer, engine_server
from helpers.serve_helpers import ServeProcess, serving, wait_for

ENGINE_MODEL = "engine-served-model"
STALLED = 300
# the engine's pace: 4 ids per chunk every 100 ms, so a stalled client's 200-id echo generates for ~5 s
ENGINE_PACE = ("--step-interval-ms", "100", "--tokens-per-step", "4")
# detok's processes (supervisor, front, engine, 2 workers) hold 520-630 MB here just after start (the engine ~215
# with grpc, the front ~150) and ~550 MB with the 300 stalled streams open: a buffer per stream that grew with the
# engine's output (or the ids of 300 paused streams piling up) would not stay under this
MAX_SERVICE_RSS_MB = 800


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineServer]:
    with engine_server("--source", "echo", *ENGINE_PACE, "--set", f'front.model_name="{ENGINE_MODEL}"') as server:
        yield server


def relay(engine: EngineServer, *extra: str) -> AbstractContextManager[ServeProcess]:
    """Default settings but for the stats intervals (so /stats and the served name follow quickly); ready once both
    workers are registered with the engine (/health says 200 from the first one on, and a test that fills each
    worker's stop budget needs both)."""
    return serving(
        "--workers", "2", "--source", "grpc", "--engine-url", engine.url, *extra,
        "--set", "worker.stats_interval_s=0.1", "--set", "engine.stats_interval_s=0.1",
        ready=lambda service: len(service.stats()["engine"]["workers"]) == 2,
    )  # fmt: skip


def streamed_text(events: list[bytes]) -> str:
    """The text of a /v1/completions SSE stream's payloads (read_sse_events); an error event fails the test."""
    parts = []
    for payload in events:
        if payload == b"[DONE]":
            continue
        event = json.loads(payload)
        assert "error" not in event, event
        parts.extend(choice["text"] for choice in event["choices"])
    return "".join(parts)


def test_300_clients_that_never_read_do_not_hold_back_a_normal_client(engine: EngineServer, qwen3: Any) -> None:
    stalled_cases = faults.echo_cases(qwen3, STALLED, seed=300, min_tokens=200, stop_share=0.0)
    normal_cases = faults.echo_cases(qwen3, 3, seed=301, min_tokens=12, stop_share=0.0)
    with relay(engine) as service:
        pids = [service.proc.pid, *faults.service_pids(service).values()]
        requests_before = engine.count("requests")
        stalled = [faults.stalled_stream(service, case.body(True)) for case in stalled_cases]
        try:
            # every stalled request is generating on the engine before the normal client asks
            wait_for(lambda: engine.count("requests") - requests_before >= STALLED, 30, what="300 engine requests")

            async def normal(case: EchoCase) -> tuple[Outcome, float]:
                arrivals: list[float] = []
                async with faults.http_client(service) as client:
                    asked = time.monotonic()
                    outcome = await bounded(faults.stream_completion(client, case.body(True), arrivals))
                return outcome, (arrivals[0] - asked if arrivals else float("inf"))

            running_during_first = 0
            for case in normal_cases:
                outcome, first_token_s = asyncio.run(normal(case))
                running_during_first = running_during_first or engine.count("running")
                assert (outcome.status, outcome.error) == (200, None), outcome
                assert (outcome.text, outcome.finish_reason) == reference(qwen3, case)
                print(f"first token after {first_token_s:.3f} s")
                assert first_token_s < 1.0, f"first token after {first_token_s:.2f} s"
            # the stalled ones were still generating while the first normal request was served
            assert running_during_first > STALLED // 2
            rss_mb = sum(faults.rss_kb(pid) for pid in pids) / 1024
            print(f"detok's processes: {rss_mb:.0f} MB RSS with {STALLED} stalled streams")
            assert rss_mb < MAX_SERVICE_RSS_MB
            for case, raw in zip(stalled_cases, stalled, strict=True):  # read at last: each stream is exact
                assert streamed_text(faults.read_sse_events(raw, timeout=30)) == reference(qwen3, case)[0]
        finally:
            for raw in stalled:
                raw.close()
        wait_for(lambda: engine.count("running") == 0, 30, what="the engine to end every request")


def test_a_request_no_worker_has_room_for_gets_429_before_any_200(engine: EngineServer, qwen3: Any) -> None:
    """2 workers of 100 stop-string characters each: two streams with 60 each fill them; a third with 60 is refused
    with 429 and Retry-After (streamed or not), one with 30 still fits, one with 101 can never fit (400)."""
    (long_case,) = faults.echo_cases(qwen3, 1, seed=302, min_tokens=100, stop_share=0.0)  # ~2.5 s of generation
    (short_case,) = faults.echo_cases(qwen3, 1, seed=303, min_tokens=12, stop_share=0.0)

    def body(case: EchoCase, stream: bool, stop_chars: int) -> dict[str, Any]:
        return {**case.body(stream), "stop": ["\u00a7" * stop_chars]}  # never in the output

    async def run(service: ServeProcess) -> list[Any]:
        async with faults.http_client(service) as client:
            streams = [faults.stream_completion(client, body(long_case, True, 60)) for _ in range(2)]
            holders = [asyncio.create_task(bounded(stream)) for stream in streams]
            await asyncio.to_thread(wait_for, lambda: engine.count("running") >= 2, 30, what="the two holders")
            answers: list[Any] = []
            for stream, chars in ((True, 60), (False, 60), (True, 101)):
                answers.append(await client.post("/v1/completions", json=body(short_case, stream, chars)))
            answers.append(await bounded(faults.stream_completion(client, body(short_case, True, 30))))
            return answers + await asyncio.gather(*holders)

    with relay(engine, "--set", "worker.max_live_stop_chars=100") as service:
        refused_stream, refused_whole, never, fits, *holders = asyncio.run(run(service))
    for refused in (refused_stream, refused_whole):
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["content-type"] == "application/json"
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("stop_budget", "stop")
        assert "worker.max_live_stop_chars = 100" in error["message"]
    assert never.status_code == 400 and never.json()["error"]["param"] is None, never.text
    assert (fits.status, fits.error, fits.text) == (200, None, reference(qwen3, short_case)[0])
    for holder in holders:
        assert (holder.status, holder.error, holder.text) == (200, None, reference(qwen3, long_case)[0])


def test_the_engines_served_model_name_is_served(engine: EngineServer, qwen3: Any) -> None:
    (case,) = faults.echo_cases(qwen3, 1, seed=304, min_tokens=12, stop_share=0.0)
    with relay(engine) as service:
        models = httpx.get(f"{service.url}/v1/models", timeout=10).json()
        assert [card["id"] for card in models["data"]] == [ENGINE_MODEL]
        # the engine's context length (GetModelInfo's max_context_length), not the tokenizer's model_max_length
        assert [card["max_model_len"] for card in models["data"]] == [1 << 20]
        assert httpx.get(f"{service.url}/v1/models/{ENGINE_MODEL}", timeout=10).status_code == 200
        body = {**case.body(False), "model": ENGINE_MODEL}
        answer = httpx.post(f"{service.url}/v1/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        served = answer.json()
        assert (served["model"], served["choices"][0]["text"]) == (ENGINE_MODEL, reference(qwen3, case)[0])
        tokenizer_name = httpx.post(f"{service.url}/v1/completions", json={**body, "model": "qwen3"}, timeout=30)
        assert tokenizer_name.status_code == 404  # front.model_name would win: tests/unit/front/test_refusals.py


def test_a_frozen_front_pauses_the_relayed_streams_and_loses_nothing(qwen3: Any) -> None:
    """Tiny bus queues, the front frozen (SIGSTOP) for 3 s mid-stream: the workers block on it, the gateway's batches
    to them wait (a stream whose ids back up is not read, so gRPC's flow control holds the engine), nothing is
    declared dead; once the front resumes every text completes exactly."""
    long_token = 89180  # qwen3: 114 characters, so a stream's text is far more than the socket buffers hold
    cases = [EchoCase([long_token] * 3000, [], 3001) for _ in range(6)]
    cases += faults.echo_cases(qwen3, 20, seed=305, min_tokens=150, stop_share=0.3)
    with (
        engine_server("--source", "echo", "--step-interval-ms", "2", "--tokens-per-step", "4") as flat_out,
        relay(flat_out, "--set", "bus.high_water_mark=4") as service,
    ):
        front = faults.service_pids(service)["front"]
        arrivals: list[list[float]] = [[] for _ in cases]
        resumed_at = 0.0

        async def run() -> list[Outcome]:
            nonlocal resumed_at
            async with faults.http_client(service) as client:
                streams = [
                    asyncio.create_task(bounded(faults.stream_completion(client, c.body(True), times)))
                    for c, times in zip(cases, arrivals, strict=True)
                ]
                await asyncio.sleep(0.5)  # every request is streaming by now
                os.kill(front, signal.SIGSTOP)
                try:
                    await asyncio.sleep(3.0)
                finally:
                    os.kill(front, signal.SIGCONT)
                    resumed_at = time.monotonic()
                return await asyncio.gather(*streams)

        outcomes = asyncio.run(run())
        # each long stream needs >= 1.5 s of engine steps: it was live when the front froze, and its text went on
        # after the front resumed (held in detok and gRPC's window meanwhile, nothing dropped: the texts below)
        assert all(times and times[-1] > resumed_at for times in arrivals[:6]), [t[-1:] for t in arrivals[:6]]
        for case, outcome in zip(cases, outcomes, strict=True):
            assert (outcome.status, outcome.error, (outcome.text, outcome.finish_reason)) == (
                200,
                None,
                reference(qwen3, case),
            )
        assert service.stats()["engine"]["reopened"] == 0
