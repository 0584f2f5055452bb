"""One heavy request must not hurt the others on a real `detok serve`:
- requests at the stop-string maxima (64 strings of 1,024 characters each, every request its own set) next to
  plain requests: the plain ones are exact and no worker is restarted or declared dead;
- a 3.9 MB prompt is refused with a 400 naming the field, and /health keeps answering meanwhile (ticking client);
- prompt-token limits give a 400 naming the field.
The full sizes of the stop-string case (100 + 50 requests) run under the slow marker."""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.fault_helpers import (
    bounded,
    echo_cases,
    echo_service,
    http_client,
    reference,
    rss_kb,
    service_pids,
    stream_completion,
)
from helpers.serve_helpers import ServeProcess

MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(2, 2, "--set", "front.max_prompt_tokens=5000") as serve:
        yield serve


def _stop_set(rng: random.Random) -> list[str]:
    """64 stop strings of 1,024 characters that never occur in the echoed corpus text ("~" starts each)."""
    letters = string.ascii_letters
    return ["~" + "".join(rng.choices(letters, k=MAX_STOP_CHARS - 1)) for _ in range(MAX_STOP_STRINGS)]


def _heavy_and_plain(service: ServeProcess, tokenizer: Any, heavy: int, plain: int) -> None:
    pids = service_pids(service)
    workers = [pid for role, pid in pids.items() if role.startswith("worker")]
    rss_before = {pid: rss_kb(pid) for pid in workers}
    reopened = service.stats()["engine"]["reopened"]
    rng = random.Random(14)
    heavy_cases = echo_cases(tokenizer, heavy, seed=140, stop_share=0.0)
    plain_cases = echo_cases(tokenizer, plain, seed=141)
    heavy_bodies = [{**case.body(True), "stop": _stop_set(rng)} for case in heavy_cases]

    async def run() -> tuple[list[Any], list[Any]]:
        async with http_client(service) as client:
            heavy_runs = [bounded(stream_completion(client, body)) for body in heavy_bodies]
            plain_runs = [bounded(stream_completion(client, case.body(True))) for case in plain_cases]
            outcomes = await asyncio.gather(*heavy_runs, *plain_runs)
            return outcomes[:heavy], outcomes[heavy:]

    heavy_outcomes, plain_outcomes = asyncio.run(run())
    for case, outcome in zip(plain_cases, plain_outcomes, strict=True):
        assert (outcome.status, outcome.error, (outcome.text, outcome.finish_reason)) == (
            200,
            None,
            reference(tokenizer, case),
        )
    for case, outcome in zip(heavy_cases, heavy_outcomes, strict=True):
        if outcome.error is not None:  # the only refusal allowed: the worker's stop-string memory bound
            assert "worker.max_live_stop_chars" in outcome.error["message"], outcome.error
        else:
            assert (outcome.text, outcome.finish_reason) == reference(tokenizer, case)
    assert service_pids(service) == pids  # no worker restarted
    assert service.stats()["engine"]["reopened"] == reopened  # none declared dead
    assert sum(o.error is None for o in heavy_outcomes) == heavy  # the default bound holds 50 per worker
    # the automaton is built lazily, and the cache keeps at most 32 per worker: growth stays bounded
    growth_mb = {pid: (rss_kb(pid) - rss_before[pid]) / 1024 for pid in workers}
    print(f"worker RSS growth (MB): {growth_mb}")
    assert all(growth < 150 for growth in growth_mb.values()), growth_mb


def test_stop_string_maxima_do_not_hurt_plain_requests(service: ServeProcess, tokenizer: Any) -> None:
    # 40 heavy requests: ~20 stop sets per worker in one batch, which must not stall the worker past its timeout
    _heavy_and_plain(service, tokenizer, heavy=40, plain=20)


@pytest.mark.slow
def test_stop_string_maxima_full_size(service: ServeProcess, tokenizer: Any) -> None:
    _heavy_and_plain(service, tokenizer, heavy=100, plain=50)


async def _tick_health(client: Any, stop: asyncio.Event, gaps: list[float]) -> None:
    """GET /health every 10 ms; records the time between consecutive answers."""
    last = time.perf_counter()
    while not stop.is_set():
        response = await client.get("/health")
        assert response.status_code == 200
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
        await asyncio.sleep(0.01)


def test_huge_prompt_is_refused_without_stalling_health(service: ServeProcess) -> None:
    prompt = ("All work and no play makes Jack a dull boy. " * 90_000)[:3_900_000]
    gaps: list[float] = []

    async def run() -> Any:
        async with http_client(service) as client:
            stop = asyncio.Event()
            ticker = asyncio.create_task(_tick_health(client, stop, gaps))
            await asyncio.sleep(0.2)
            response = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 5})
            await asyncio.sleep(0.2)
            stop.set()
            await ticker
            return response

    response = asyncio.run(run())
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "prompt_too_long")
    assert "3900000 characters" in error["message"]
    print(f"/health: {len(gaps)} answers, longest gap {max(gaps) * 1000:.0f} ms")
    # a tokenizer holding the GIL over the whole prompt would freeze the front; a loose bound, not a benchmark
    assert max(gaps) < 1.0


def test_prompt_token_limits_name_the_field(service: ServeProcess, tokenizer: Any) -> None:
    text = "word " * 6000  # 6,000 tokens > front.max_prompt_tokens = 5000, well under the character limit

    async def run() -> list[Any]:
        async with http_client(service) as client:
            return [
                await client.post("/v1/completions", json={"prompt": text, "max_tokens": 5}),
                await client.post("/v1/completions", json={"prompt": [100] * 5001, "max_tokens": 5}),
                await client.post(
                    "/v1/chat/completions", json={"messages": [{"role": "user", "content": text}], "max_tokens": 5}
                ),
                await client.post("/v1/completions", json={"prompt": "Hello there, " * 400, "max_tokens": 5000}),
            ]

    too_long, too_many_ids, chat, fine = asyncio.run(run())
    for response, param in ((too_long, "prompt"), (too_many_ids, "prompt"), (chat, "messages")):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == (param, "prompt_too_long")
        assert "at most 5000 are allowed" in error["message"]
    assert fine.status_code == 200
    assert fine.json()["choices"][0]["text"] == "Hello there, " * 400  # 1,600 tokens: under the limit
