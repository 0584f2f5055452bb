"""Elastic workers under streaming load, through a real `detok serve --workers 1 --source echo`: a second worker
joins mid-load (SIGTTIN to the supervisor; in the slow variant also a `detok worker` started on its own against
the same runtime dir), then the first one leaves gracefully (SIGTTOU retires the oldest: SIGTERM, Goodbye, the
engine re-opens its requests on the other worker). Every text must be exact; nothing is restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
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
from helpers.serve_helpers import REPO, ServeProcess, pid_alive, wait_for

STEP_MS = 4


def engine_workers(service: ServeProcess) -> dict[str, int]:
    return service.stats()["engine"]["workers"]


async def staggered_load(
    service: ServeProcess, cases: list[EchoCase], gap_s: float, second_half_after: asyncio.Event
) -> list[Any]:
    """Send the cases `gap_s` apart; the second half only once `second_half_after` is set (so a machine too busy
    to finish the first event in time cannot run out of load before it)."""
    half = len(cases) // 2
    async with http_client(service) as client:

        async def one(index: int, case: EchoCase) -> Any:
            if index >= half:
                await second_half_after.wait()
            await asyncio.sleep((index - half if index >= half else index) * gap_s)
            return await stream_completion(client, case.body(True))

        return await asyncio.gather(*(bounded(one(i, case)) for i, case in enumerate(cases)))


async def load_with_events(
    service: ServeProcess, cases: list[EchoCase], gap_s: float, events: list[Callable[[], None]]
) -> list[Any]:
    """Run the load; meanwhile run each (blocking) event in turn, in a thread. The second half of the load starts
    when the first event is done."""
    first_event_done = asyncio.Event()

    async def run_events() -> None:
        for index, event in enumerate(events):
            await asyncio.to_thread(event)
            if index == 0:
                first_event_done.set()
        first_event_done.set()

    outcomes, _ = await asyncio.gather(staggered_load(service, cases, gap_s, first_event_done), run_events())
    return outcomes


def assert_exact(tokenizer: Any, cases: list[EchoCase], outcomes: list[Any]) -> None:
    wrong = [
        (i, outcome, reference(tokenizer, case))
        for i, (case, outcome) in enumerate(zip(cases, outcomes, strict=True))
        if (outcome.status, outcome.error, outcome.text, outcome.finish_reason)
        != (200, None, *reference(tokenizer, case))
    ]
    assert not wrong, f"{len(wrong)} of {len(cases)} requests differ; first: {wrong[0]}"


def join_and_leave_round(service: ServeProcess, tokenizer: Any, requests: int, seed: int, extra_worker: bool) -> None:
    (first_pid,) = service.child_pids("worker")
    (first_id,) = wait_for(lambda: engine_workers(service), 20, what="the first worker")
    reopened_before = service.stats()["engine"]["reopened"]
    joiner: list[subprocess.Popen[bytes]] = []

    def add_worker() -> None:
        wait_for(lambda: engine_workers(service)[first_id] > 5, 10, what="load on the first worker")
        service.proc.send_signal(signal.SIGTTIN)
        wait_for(lambda: len(engine_workers(service)) == 2, 20, what="the second worker to join")

    def start_extra_worker() -> None:
        command = [sys.executable, "-m", "detok_worker.cli", "worker", "--id", "extra"]
        command += ["--config", str(service.runtime_dir / "config.toml")]
        joiner.append(subprocess.Popen(command, cwd=REPO))
        wait_for(lambda: "extra" in engine_workers(service), 20, what="the extra worker to join")
        wait_for(lambda: engine_workers(service).get("extra", 0) > 0, 10, what="requests on the extra worker")

    def retire_first() -> None:
        wait_for(lambda: min(engine_workers(service).values()) > 0, 10, what="requests on every worker")
        service.proc.send_signal(signal.SIGTTOU)
        wait_for(lambda: first_id not in engine_workers(service), 10, what="the first worker to leave")

    def stop_extra_worker() -> None:
        joiner[0].send_signal(signal.SIGTERM)
        assert joiner[0].wait(timeout=10) == 0

    events = [add_worker, retire_first]
    if extra_worker:
        events = [add_worker, start_extra_worker, retire_first, stop_extra_worker]
    cases = echo_cases(tokenizer, requests, seed, min_tokens=100, stop_share=0.5)
    try:
        outcomes = asyncio.run(load_with_events(service, cases, 6.0 / requests, events))
    finally:
        for process in joiner:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert_exact(tokenizer, cases, outcomes)

    wait_for(lambda: not pid_alive(first_pid), 10, what="the retired worker to exit")
    (second_pid,) = service.child_pids("worker")  # retired, not restarted
    assert second_pid != first_pid
    assert list(engine_workers(service)) != [first_id]
    stats = service.stats()
    assert stats["engine"]["reopened"] > reopened_before  # the leaver held live requests: they moved
    assert [w["tokens_in"] > 0 for w in stats["workers"].values() if w["pid"] == second_pid] == [True]
    assert "leaves" in service.log(tail=None) and "restarting" not in service.log(tail=None)
    wait_for(lambda: all_idle(service), 10, what="live rids 0 everywhere")


@pytest.fixture
def service() -> Iterator[ServeProcess]:
    with echo_service(1, STEP_MS) as serve:
        yield serve


def test_worker_joins_and_the_first_leaves_under_load(service: ServeProcess, tokenizer: Any) -> None:
    join_and_leave_round(service, tokenizer, requests=60, seed=31, extra_worker=False)


@pytest.mark.slow
def test_supervised_and_standalone_workers_join_and_leave_under_load(service: ServeProcess, tokenizer: Any) -> None:
    join_and_leave_round(service, tokenizer, requests=200, seed=32, extra_worker=True)


def test_requests_sent_while_the_only_worker_restarts_wait_for_it(service: ServeProcess, tokenizer: Any) -> None:
    """`--workers 1` and the worker dies: requests that arrive before its replacement is up are not refused
    (the engine holds them up to ORPHAN_GRACE_S for a worker), and every text is exact. The supervisor is stopped
    (SIGSTOP) while the worker dies, so its replacement, which registers well within the engine's heartbeat timeout,
    comes only after the engine has seen no worker and the first requests wait."""
    (worker_id,) = wait_for(lambda: engine_workers(service), 20, what="the worker")
    (pid,) = service.child_pids("worker")
    supervisor = service.proc.pid
    os.kill(supervisor, signal.SIGSTOP)
    try:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not engine_workers(service), 10, what="the engine to notice that no worker is left")
    except BaseException:
        os.kill(supervisor, signal.SIGCONT)
        raise

    def restart_worker() -> None:
        wait_for(lambda: service.stats()["engine"]["live_rids"] > 0, 10, what="requests waiting for a worker")
        os.kill(supervisor, signal.SIGCONT)  # it reaps the dead worker and starts its replacement

    cases = echo_cases(tokenizer, 20, seed=33)
    try:
        outcomes = asyncio.run(load_with_events(service, cases, 0.01, [restart_worker]))
    finally:
        os.kill(supervisor, signal.SIGCONT)
    assert_exact(tokenizer, cases, outcomes)
    assert service.child_pids("worker") != [pid]
    wait_for(lambda: all_idle(service) and engine_workers(service) == {worker_id: 0}, 10, what="the new worker idle")
