"""Requests that end early, through a real `detok serve` with a slow engine (20 ms per step, so a long echo
would run for many seconds): a stop string must stop generation in the engine, and a client that goes away
must free the request everywhere (front, engine, worker) within about a second.

Engine and workers report stats every 50 ms here, so /stats shows a freed rid within 1 s plus at most that lag."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.serve_helpers import ServeProcess, http_json, serving, wait_for

openai = pytest.importorskip("openai")

STEP_MS = 20
LONG_TAIL = " filler" * 600  # ~600 tokens: 12 s of generation at 20 ms per step
STATS_INTERVAL_S = 0.05
FREED_WITHIN_S = 1.0 + STATS_INTERVAL_S  # the 1 s requirement + the reporting lag of /stats


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving(
        "--workers", "2", "--source", "echo", "--step-interval-ms", str(STEP_MS),
        "--set", f"worker.stats_interval_s={STATS_INTERVAL_S}", "--set", f"engine.stats_interval_s={STATS_INTERVAL_S}",
    ) as serve:  # fmt: skip
        yield serve


@pytest.fixture(scope="module")
def model(service: ServeProcess) -> str:
    return http_json(f"{service.url}/v1/models")[1]["data"][0]["id"]


def live_counts(service: ServeProcess) -> tuple[int, int, int]:
    stats = service.stats()
    workers = sum(worker["live_rids"] for worker in stats["workers"].values())
    return stats["front"]["live_rids"], stats["engine"]["live_rids"], workers


def test_stop_string_stops_generation_in_the_engine(service: ServeProcess, model: str) -> None:
    prompt = "Stop right here, please." + LONG_TAIL

    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0) as client:
            return await client.completions.create(model=model, prompt=prompt, max_tokens=2000, stop=[" here"])

    response = asyncio.run(asyncio.wait_for(run(), 30))
    assert response.choices[0].text == "Stop right"
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.completion_tokens < 10
    # the engine stopped: nothing is generating any more, long before the echo would have ended (12 s)
    wait_for(lambda: live_counts(service) == (0, 0, 0), FREED_WITHIN_S, what="live rids 0 after the stop")


def test_client_disconnect_aborts_and_frees_the_rid(service: ServeProcess, model: str) -> None:
    aborted_before = service.stats()["engine"]["aborted"]

    async def read_a_little_then_leave() -> str:
        async with openai.AsyncOpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0) as client:
            stream = await client.completions.create(
                model=model, prompt="Tell me a long story." + LONG_TAIL, max_tokens=2000, stream=True
            )
            received = ""
            async for chunk in stream:
                received += chunk.choices[0].text if chunk.choices else ""
                if len(received) > 20:
                    break
            wait_for(lambda: live_counts(service)[1] == 1, 5, what="the request generating in the engine")
            await stream.close()
            return received

    received = asyncio.run(asyncio.wait_for(read_a_little_then_leave(), 30))
    assert received.startswith("Tell me a long story.")
    wait_for(lambda: live_counts(service) == (0, 0, 0), FREED_WITHIN_S, what="live rids 0 after the disconnect")
    assert service.stats()["engine"]["aborted"] == aborted_before + 1
