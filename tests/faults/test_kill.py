"""Kill test: a real `detok serve --workers 2 --source echo`, many concurrent streaming requests with stop
strings over HTTP, and one worker SIGKILLed at a random (seeded) moment. Every request must complete with exactly
its reference text (no character lost or repeated), none may hang, and the supervisor must bring the worker back.

Also a frozen worker (SIGSTOP): declared dead after 1 s without heartbeats, registers again (same pid) when it resumes.

Default suite: 80 requests for each of 2 seeds on one service; `-m slow`: 200 requests for each of 5 seeds, and
both workers killed one after the other (the second while the first is still restarting) for 3 more seeds."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.fault_helpers import (
    EchoCase,
    all_idle,
    bounded,
    echo_cases,
    echo_service,
    http_client,
    reference,
    stream_completion,
)
from helpers.serve_helpers import ServeProcess, wait_for

STEP_MS = 4  # requests of 150+ tokens (stopped from a third of their text on) run 0.2 s or more


HELD_AT_KILL = 4  # requests the victim holds when it is killed


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(2, STEP_MS) as serve:
        yield serve


def worker_pids(service: ServeProcess) -> dict[str, int]:
    return {wid: stats["pid"] for wid, stats in service.stats()["workers"].items()}


async def run_with_kills(
    service: ServeProcess, cases: list[EchoCase], kills: list[tuple[float, str, int]]
) -> list[Any]:
    """Run the requests; SIGKILL each (delay, worker id, pid) meanwhile, once that worker holds several requests (on
    a fast run the delay alone could come after its requests ended, and a kill would then re-open nothing; with one
    held, it can end, or be a stopped one waiting for its release, between the /stats read and the kill)."""

    async def killer() -> None:
        for delay, worker, pid in kills:
            await asyncio.sleep(delay)
            while (await asyncio.to_thread(service.stats))["engine"]["workers"].get(worker, 0) < HELD_AT_KILL:
                await asyncio.sleep(0.005)
            os.kill(pid, signal.SIGKILL)

    async with http_client(service) as client:
        kill = asyncio.create_task(killer())
        outcomes = await asyncio.gather(*(bounded(stream_completion(client, case.body(True))) for case in cases))
        if not kill.done():
            kill.cancel()
            raise AssertionError("every request ended before a victim held one: nothing was killed under load")
        await kill
    return outcomes


def kill_round(service: ServeProcess, tokenizer: Any, requests: int, seed: int, both: bool = False) -> None:
    """SIGKILL one worker (with `both`, then the other one while the first is still restarting)."""
    rng = random.Random(seed)
    before = wait_for(lambda: len(p := worker_pids(service)) == 2 and p, 20, what="2 workers in /stats")
    reopened_before = service.stats()["engine"]["reopened"]
    victims = rng.sample(sorted(before), 2 if both else 1)
    kills = [(rng.uniform(0.05, 0.3), victims[0], before[victims[0]])]
    if both:
        kills.append((rng.uniform(0.05, 0.3), victims[1], before[victims[1]]))
    # long enough (150+ tokens before their stop, 0.6 s+ at STEP_MS) that the victim still holds several when the
    # kill's delay is over, on a fast machine too
    cases = echo_cases(tokenizer, requests, seed, min_tokens=150)
    outcomes = asyncio.run(run_with_kills(service, cases, kills))

    mismatches = []
    for index, (case, outcome) in enumerate(zip(cases, outcomes, strict=True)):
        text, finish = reference(tokenizer, case)
        if (outcome.status, outcome.error, outcome.text, outcome.finish_reason) != (200, None, text, finish):
            mismatches.append((index, outcome, text, finish))
    assert not mismatches, f"{len(mismatches)} of {len(cases)} requests differ; first: {mismatches[0]}"

    # the supervisor restarts each worker in its slot: same id, new pid, serving again
    for victim in victims:
        wait_for(
            lambda v=victim: (p := worker_pids(service)).get(v) not in (None, before[v]) and len(p) == 2,
            20,
            what=f"a new pid for {victim} in /stats",
        )
    wait_for(
        lambda: service.stats()["engine"]["reopened"] > reopened_before,
        5,
        what="re-opened requests (the kill came after every request had ended?)",
    )
    assert service.stats()["front"].get("offset_gaps", 0) == 0
    wait_for(lambda: all_idle(service), 10, what="live rids 0 everywhere after the round")


@pytest.mark.parametrize("seed", [11, 12])
def test_sigkill_a_worker_under_streaming_load(service: ServeProcess, tokenizer: Any, seed: int) -> None:
    kill_round(service, tokenizer, requests=80, seed=seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [21, 22, 23, 24, 25])
def test_sigkill_a_worker_under_streaming_load_full(service: ServeProcess, tokenizer: Any, seed: int) -> None:
    kill_round(service, tokenizer, requests=200, seed=seed)


@pytest.fixture
def fresh_service() -> Iterator[ServeProcess]:
    """A service of its own: the supervisor backs off restarting a slot that keeps dying (0.25 s doubling, reset
    after 10 s up), and after the rounds above a double kill would outlast the engine's ORPHAN_GRACE_S (5 s)."""
    with echo_service(2, STEP_MS) as serve:
        yield serve


@pytest.mark.slow
@pytest.mark.parametrize("seed", [31, 32, 33])
def test_sigkill_both_workers_one_after_the_other(fresh_service: ServeProcess, tokenizer: Any, seed: int) -> None:
    kill_round(fresh_service, tokenizer, requests=200, seed=seed, both=True)


FREEZE_S = 4.0  # > engine.heartbeat_timeout_s (1 s) + the time the moved requests need to finish elsewhere


def test_frozen_worker_loses_its_requests_and_rejoins(service: ServeProcess, tokenizer: Any) -> None:
    """SIGSTOP (a hung process, a long GC pause, a frozen VM): no heartbeat for 1 s, so the engine moves the
    worker's requests; they all finish exactly while it is still frozen. Resumed, it still holds those requests:
    the engine tells it to rejoin, and it drops them and registers again (same process)."""
    before = wait_for(lambda: len(p := worker_pids(service)) == 2 and p, 20, what="2 workers in /stats")
    reopened_before = service.stats()["engine"]["reopened"]
    victim_id = random.Random(41).choice(sorted(before))
    cases = echo_cases(tokenizer, 60, seed=41, min_tokens=150)
    resumed_at: list[float] = []

    async def run() -> list[tuple[Any, float]]:
        async def timed(case: EchoCase) -> tuple[Any, float]:
            outcome = await stream_completion(client, case.body(True))
            return outcome, time.monotonic()

        async def freeze() -> None:
            await asyncio.sleep(0.2)
            # only once it holds requests (on a loaded machine they may not have reached it yet): a worker frozen
            # while empty says so in its first heartbeat and is simply registered again, no rejoin needed
            while (await asyncio.to_thread(service.stats))["engine"]["workers"].get(victim_id, 0) == 0:
                await asyncio.sleep(0.01)
            os.kill(before[victim_id], signal.SIGSTOP)
            await asyncio.sleep(FREEZE_S)
            resumed_at.append(time.monotonic())
            os.kill(before[victim_id], signal.SIGCONT)

        async with http_client(service) as client:
            freezer = asyncio.create_task(freeze())
            results = await asyncio.gather(*(bounded(timed(case)) for case in cases))
            await freezer
        return results

    results = asyncio.run(run())
    for case, (outcome, _) in zip(cases, results, strict=True):
        expected = (200, None, *reference(tokenizer, case))
        assert (outcome.status, outcome.error, outcome.text, outcome.finish_reason) == expected
    assert max(done for _, done in results) < resumed_at[0]  # nobody waited for the frozen worker
    wait_for(lambda: service.stats()["engine"]["reopened"] > reopened_before, 5, what="re-opened requests")
    # it drops the stale requests and registers again, in the same process (nothing restarts a worker started
    # on its own, so it must not exit)
    wait_for(lambda: f"worker {victim_id}: the engine asked to rejoin" in service.log(tail=None), 20, what="rejoin")
    wait_for(lambda: worker_pids(service) == before, 20, what=f"{victim_id} serving again with its pid")
    wait_for(lambda: all_idle(service), 10, what="live rids 0 everywhere")
