"""The engine's liveness rule (WorkerRegistry, pure: the clock is an argument): silence counts only the time in which
a heartbeat could have come through. A stall of the engine's loop and a worker's wait for a CPU are excused; a
worker silent while the engine ran and the worker was not starved (stopped, killed) is lost on time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq
from helpers.scheduler_steps import new_scheduler

from detok_worker.bus.codec import encode, engine_decoder
from detok_worker.bus.messages import Heartbeat, Hello
from detok_worker.engine import worker_channel
from detok_worker.engine.cpu_wait import cpu_wait_s, is_sibling, waiting_now_s
from detok_worker.engine.front_channel import BusNews
from detok_worker.engine.scheduler import Scheduler
from detok_worker.engine.worker_channel import WorkerChannel
from detok_worker.engine.workers import WorkerRegistry

TIMEOUT = 1.0


def _registry(*workers: str) -> WorkerRegistry:
    registry = WorkerRegistry(TIMEOUT)
    for worker in workers:
        registry.hello(worker, 100, 0.0)
    return registry


def _first_silent(registry: WorkerRegistry, worker: str, until: float, tick: float = 0.01) -> float | None:
    """The first check time (an engine loop checking every `tick`) at which `worker` is named silent."""
    for index in range(int(until / tick) + 1):
        now = index * tick
        if worker in registry.silent(now):
            return now
    return None


def test_worker_silent_while_engine_runs_is_lost_on_time() -> None:
    registry = _registry("w0", "w1")
    for beat in range(1, 30):  # w1 beats every 0.2 s; w0 says nothing after its Hello
        registry.heartbeat("w1", 0, beat * 0.2)
        assert "w1" not in registry.silent(beat * 0.2 + 0.01)
    lost_at = _first_silent(registry, "w0", 2.0)
    assert lost_at is not None and TIMEOUT < lost_at <= TIMEOUT + 0.02
    next_deadline = registry.next_deadline()
    assert next_deadline is not None and next_deadline <= TIMEOUT  # an idle engine wakes for it


def test_engine_stall_longer_than_timeout_does_not_lose_a_worker_that_beats_right_after() -> None:
    registry = _registry("w0")
    registry.heartbeat("w0", 1, 0.2)
    # the engine's loop did not run from 0.25 to 3.25: its first check after the stall excuses those 3 s
    registry.excuse_stall(3.0)
    assert registry.silent(3.25) == []
    registry.heartbeat("w0", 1, 3.26)  # the beats that waited meanwhile are read right after
    assert registry.silent(3.3) == []
    # a heartbeat ends the excuse: silent from now on, the worker is lost after the plain timeout again
    assert registry.silent(3.26 + TIMEOUT + 0.01) == ["w0"]


def test_engine_stall_only_delays_a_dead_worker_by_the_stall() -> None:
    registry = _registry("w0")
    registry.excuse_stall(0.5)  # the worker died at 0; the engine stalled half a second meanwhile
    assert registry.silent(TIMEOUT + 0.4) == []
    assert registry.silent(TIMEOUT + 0.51) == ["w0"]


def test_starved_worker_is_excused_its_cpu_wait_and_not_more() -> None:
    registry = _registry("w0", "w1")
    now = TIMEOUT + 0.05
    assert [info.worker for info in registry.overdue(now)] == ["w0", "w1"]
    registry.excuse_starved("w0", 0.8)  # runnable, not run, for 0.8 s of its silence
    assert registry.silent(now) == ["w1"]  # w1 earned no excuse (stopped or dead)
    assert registry.overdue(now)[0].worker == "w1"
    assert registry.silent(TIMEOUT + 0.79) == ["w1"]
    assert registry.silent(TIMEOUT + 0.81) == ["w0", "w1"]
    registry.excuse_starved("w0", 0.5)  # a total since its last heartbeat, not more time: nothing changes
    assert registry.silent(TIMEOUT + 0.79) == ["w1"]
    assert registry.silent(TIMEOUT + 0.81) == ["w0", "w1"]


def test_heartbeat_clears_the_starved_excuse() -> None:
    registry = _registry("w0")
    registry.excuse_starved("w0", 5.0)
    registry.heartbeat("w0", 0, 2.0)
    assert registry.silent(2.0 + TIMEOUT + 0.01) == ["w0"]


def test_scheduler_counts_workers_declared_lost_but_not_goodbyes() -> None:
    scheduler = new_scheduler()
    for worker in ("w0", "w1", "w2", "w3"):
        scheduler.hello(worker, 1, 0.0)
    scheduler.goodbye("w3")  # leaves: not a loss
    scheduler.heartbeat("w1", 0, 0.9)
    scheduler.heartbeat("w2", 0, 0.9)
    assert scheduler.expire_workers(1.5) == ["w0"]
    scheduler.worker_unreachable("w1")
    scheduler.worker_unreachable("w1")  # already gone: counted once
    scheduler.hello("w2", 2, 1.6)  # restarted while registered: its previous process was lost
    scheduler.hello("w2", 2, 1.7)  # the same process registering again (a rejoin): not another loss
    assert scheduler.lost_workers == 3


def test_cpu_wait_is_measured_for_siblings_only() -> None:
    waited = cpu_wait_s(os.getpid())
    assert waited is None or waited >= 0.0  # None only on a kernel without scheduler statistics
    assert is_sibling(os.getpid())  # a process with this one's parent (as workers are the engine's, in detok serve)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"]) as child:
        try:
            assert not is_sibling(child.pid)  # this process's child: another parent
        finally:
            child.kill()
    assert not is_sibling(-1)
    assert cpu_wait_s(2**22 + 12345) is None  # no such process


@contextlib.contextmanager
def worker_w0(
    heartbeat_interval_s: float = 0.0,
) -> Iterator[tuple[Scheduler, WorkerChannel, Callable[[object, float], None]]]:
    """A WorkerChannel on an in-process ROUTER, and `deliver(message, now)`: w0 sends it, the channel reads it."""
    context = zmq.Context()
    router, worker = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    worker.setsockopt(zmq.ROUTING_ID, b"w0")
    router.bind("inproc://liveness")
    worker.connect("inproc://liveness")
    scheduler = new_scheduler(heartbeat_timeout_s=TIMEOUT)
    channel = WorkerChannel(router, scheduler, engine_decoder(), None, heartbeat_interval_s)

    def deliver(message: object, now: float) -> None:
        worker.send(encode(message))
        assert router.poll(5000)
        channel.drain(BusNews(), now)

    try:
        yield scheduler, channel, deliver
    finally:
        router.close(linger=0)
        worker.close(linger=0)
        context.term()


def test_a_starved_worker_judged_lost_keeps_its_cpu_wait_measured_when_it_joins_again(monkeypatch: Any) -> None:
    """A live worker the engine judged lost (starved past what it could measure) joins again by its heartbeats,
    without a Hello: its CPU wait is still measured and excused, so it is not judged lost again for the same."""
    waited = {"s": 0.0}  # the worker's CPU wait so far, as /proc would give it
    monkeypatch.setattr(worker_channel, "is_sibling", lambda pid: True)
    monkeypatch.setattr(worker_channel, "cpu_wait_s", lambda pid: waited["s"])
    monkeypatch.setattr(worker_channel, "waiting_now_s", lambda pid, slept_at_most_s: 0.0)
    with worker_w0() as (scheduler, channel, deliver):
        deliver(Hello("w0", 4242), 0.0)
        waited["s"] = 0.2
        channel.expire(1.5)  # silent 1.5 s, 0.2 of it waiting for a CPU: lost
        assert scheduler.lost_workers == 1 and "w0" not in scheduler.registry
        deliver(Heartbeat("w0", 0, -1), 1.6)  # it was alive: it joins again, holding nothing
        assert "w0" in scheduler.registry
        waited["s"] = 1.2  # then silent 1.4 s, 1.0 of it runnable but not run
        channel.expire(3.0)
        assert scheduler.lost_workers == 1 and "w0" in scheduler.registry
        channel.expire(3.7)  # past its excused deadline (1.6 + 1.0 + 1.0): lost
        assert scheduler.lost_workers == 2


def test_a_wait_for_a_cpu_still_going_on_is_excused(monkeypatch: Any) -> None:
    """The kernel adds a run queue wait to schedstat only once the thread runs: the wait still going on when the
    engine judges (the worker runnable, not run since before its silence) is excused too, and no more than it."""
    waiting_now = {"s": 0.9}
    monkeypatch.setattr(worker_channel, "is_sibling", lambda pid: True)
    monkeypatch.setattr(worker_channel, "cpu_wait_s", lambda pid: 0.2)  # waits that ended: 0.2 s, all before
    monkeypatch.setattr(worker_channel, "waiting_now_s", lambda pid, slept_at_most_s: waiting_now["s"])
    with worker_w0(heartbeat_interval_s=0.2) as (scheduler, channel, deliver):
        deliver(Hello("w0", 4242), 0.0)
        channel.expire(1.5)  # silent 1.5 s: 0.9 of it waiting still
        assert scheduler.lost_workers == 0
        waiting_now["s"] = 0.0  # it is no longer runnable (stopped): nothing more is excused
        channel.expire(2.2)  # past 0 + 1.0 + 0.9
        assert scheduler.lost_workers == 1


def test_waiting_now_is_measured_only_for_a_runnable_thread() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)
        assert waiting_now_s(sleeper.pid, 0.0) == 0.0  # asleep, not runnable
        sleeper.send_signal(signal.SIGSTOP)
        time.sleep(0.3)
        assert waiting_now_s(sleeper.pid, 0.0) == 0.0  # stopped
    finally:
        sleeper.kill()
        sleeper.wait()
    assert waiting_now_s(sleeper.pid, 0.0) == 0.0  # gone


def _fake_proc(root: Path, state: str, last_ran_ms: float, now_ms: float) -> str:
    """A procfs holding process 7 (its state, when it last ran) and the calling thread (now), in the kernel's format."""
    (root / "7").mkdir(parents=True)
    (root / "thread-self").mkdir()
    (root / "7" / "stat").write_text(f"7 (detok worker) {state} 1 7 7 0 -1")
    sched = "{} (7, #threads: 2)\n---\nse.exec_start                                :      {:.6f}\nse.vruntime : 1.0\n"
    (root / "7" / "sched").write_text(sched.format("python", last_ran_ms))
    (root / "thread-self" / "sched").write_text(sched.format("engine", now_ms))
    return str(root)


def test_waiting_now_is_the_time_since_a_runnable_main_thread_last_ran_less_its_sleep(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, "R", last_ran_ms=1000.0, now_ms=3500.0)
    assert abs(waiting_now_s(7, 0.2, proc) - 2.3) < 1e-9  # ran 2.5 s ago, of which it may have slept 0.2


def test_waiting_now_is_zero_for_a_thread_that_is_not_runnable_or_never_ran(tmp_path: Path) -> None:
    assert waiting_now_s(7, 0.2, _fake_proc(tmp_path / "asleep", "S", 1000.0, 3500.0)) == 0.0
    assert waiting_now_s(7, 0.2, _fake_proc(tmp_path / "new", "R", 0.0, 3500.0)) == 0.0
    assert waiting_now_s(7, 0.2, _fake_proc(tmp_path / "woke", "R", 3400.0, 3500.0)) == 0.0  # within its sleep


def test_this_kernel_gives_when_a_thread_last_ran() -> None:
    with open("/proc/thread-self/sched") as sched:
        assert any(line.startswith("se.exec_start") and float(line.split(":")[1]) > 0 for line in sched)
