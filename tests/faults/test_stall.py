"""The backpressure policy end to end (docs/protocol.md, Backpressure): a real `detok serve` with tiny queues
(bus.high_water_mark = 4) and streaming load; the front process is frozen (SIGSTOP) for longer than the engine's
heartbeat timeout, then resumed. While it is frozen the workers block on their full queues to it, the engine's
queues to the workers fill and their requests pause; the workers keep heartbeating, so none is declared dead and
nothing is re-opened or restarted. When the front resumes every text completes exactly."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.fault_helpers import (
    EchoCase,
    all_idle,
    bounded,
    echo_cases,
    echo_service,
    fresh_engine_stats,
    http_client,
    reference,
    service_pids,
    stream_completion,
)
from helpers.serve_helpers import ServeProcess, wait_for

# > engine.heartbeat_timeout_s (1 s): a worker blocked on the front must still look alive; and > the front's
# ENGINE_STALE_S (10 s): a request waiting for the front must not be refused for stats it has not read yet
FREEZE_S = 11.0
LONG_TOKEN = 89180  # qwen3: 114 characters
LONG_REQUESTS = 10
# 1250 steps of 4 ids, ~3.75 s at 3 ms a step: unhindered, generation ends within the freeze; paused, ~3 s of it
# remain after the front resumes, time for the resumed front (a backlog of 40 streams) to answer /stats
LONG_TOKENS = 5000
STEP_MS = 3


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(
        2, STEP_MS, "--tokens-per-step", "4", "--set", "bus.high_water_mark=4", "--set", "front.max_tokens_limit=10000",
    ) as serve:  # fmt: skip
        yield serve


def test_frozen_front_pauses_generation_and_loses_nothing(service: ServeProcess, tokenizer: Any) -> None:
    pids = service_pids(service)
    reopened = service.stats()["engine"]["reopened"]
    # ~340 KB of text each: far more than the socket buffers between a worker and the front hold
    long_cases = [EchoCase([LONG_TOKEN] * LONG_TOKENS, [], LONG_TOKENS + 1) for _ in range(LONG_REQUESTS)]
    cases = long_cases + echo_cases(tokenizer, 30, seed=51, min_tokens=150)
    # sent while the front is frozen, for longer than the front's engine-stale time: it waits in the listen
    # backlog and is answered when the front resumes, before the front has read the engine's recent stats
    late_case = echo_cases(tokenizer, 1, seed=52)[0]
    during: dict[str, Any] = {}

    async def run() -> list[Any]:
        async with http_client(service) as client:
            late: list[asyncio.Task[Any]] = []

            async def freeze_front() -> None:
                await asyncio.sleep(0.3)  # every request is streaming by now
                os.kill(pids["front"], signal.SIGSTOP)
                try:
                    await asyncio.sleep(0.5)
                    late.append(asyncio.create_task(bounded(stream_completion(client, late_case.body(True)))))
                    await asyncio.sleep(FREEZE_S - 0.5)
                finally:
                    os.kill(pids["front"], signal.SIGCONT)
                during.update(await asyncio.to_thread(fresh_engine_stats, service))

            freezer = asyncio.create_task(freeze_front())
            outcomes = await asyncio.gather(*(bounded(stream_completion(client, c.body(True))) for c in cases))
            await freezer
            return [*outcomes, await late[0]]

    outcomes = asyncio.run(run())
    cases.append(late_case)
    # generation paused while the front was frozen: unhindered it would have ended long before the front resumed
    assert during["live_rids"] > 0, during
    for case, outcome in zip(cases, outcomes, strict=True):
        expected = (200, None, *reference(tokenizer, case))
        assert (outcome.status, outcome.error, outcome.text, outcome.finish_reason) == expected
    assert service.stats()["engine"]["reopened"] == reopened  # blocked workers kept heartbeating: none declared dead
    assert service_pids(service) == pids and "restarting" not in service.log(tail=None)
    wait_for(lambda: all_idle(service), 5, what="live rids 0 everywhere")
