"""The detok worker process: a thin zmq poll loop around WorkerState.

DEALER (routing id = worker id) to the engine: receives TokenBatch/Shutdown, sends Hello, Heartbeat, Finish,
Goodbye. PUSH to the front: one TextBatch per TokenBatch with news for it (none for a batch without news),
WorkerStats every worker.stats_interval_s. With front.processes N > 1: one PUSH per front, and a TokenBatch's
deltas are split by the front of each rid (Open.front), one TextBatch per front that has any; WorkerStats go to
every front.
Backpressure: when the front does not take TextBatches (its queue is at the high-water mark) the worker stops
reading TokenBatches until it does, so the engine's queue to this worker fills and the engine pauses this
worker's rids; heartbeats keep flowing meanwhile. SIGINT/SIGTERM or a Shutdown from the engine: Goodbye (the
engine re-opens any live rids elsewhere), close, return. A Shutdown with `rejoin` (the engine restarted, or it
declared this worker dead and moved its rids): drop every rid, send Hello again, keep running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import FrameType

import zmq

from detok_worker.bus.codec import encode, worker_decoder
from detok_worker.bus.columns import split_text_batch
from detok_worker.bus.messages import Goodbye, Heartbeat, Hello, Shutdown, TextBatch, TokenBatch, WorkerStats
from detok_worker.bus.sockets import BusSockets, recv_single_frame
from detok_worker.config import DetokConfig
from detok_worker.metrics import WorkerMetrics, observe_tokenizer_load, record_worker_start
from detok_worker.process.runtime import Wakeup, stop_on_signals
from detok_worker.stream import prepare_tokenizer
from detok_worker.stream.stop.rules import StopLimits
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.worker.state import WorkerState

log = logging.getLogger(__name__)

BLOCKED_POLL_MS = 100  # blocked on the front: how long a stop signal can go unnoticed
FRAMES_PER_WAKEUP = 256  # frames handled before timers are checked again


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class RunawayWork(Exception):
    """RunawayGuard's interrupt: one stretch of a batch's work took more CPU than worker.runaway_cpu_s."""


class RunawayGuard:
    """Bounds the CPU one stretch of a batch's work may take: an Open, or the rows between two of the batch's ticks
    (WorkerState.handle_batch calls its tick after each Open and every TICK_EVERY_ITEMS rows; `progress` is that
    tick). While a batch is handled a CPU timer (ITIMER_VIRTUAL: the process's own CPU time, so time spent waiting
    for a CPU does not count) fires every `interval_s`: it runs the worker's `tick`, so heartbeats go on through a
    long stretch, and once a stretch has taken `limit_s` it raises RunawayWork in the code it interrupts, a rid's
    decode or parser, whose failure ends only that rid (WorkerState catches each rid's exceptions).

    A decoder or parser that loops would otherwise hold every request of the worker; the engine would re-open them
    elsewhere, the looping one included, and lose the next worker too. Python runs signal handlers between
    bytecodes, so a stretch stuck inside one native call is not interrupted (the engine's batch_answer_timeout_s
    still finds that worker). Off with `limit_s` 0 and outside the main thread (where no signal can be handled)."""

    def __init__(self, limit_s: float, interval_s: float, tick: Callable[[], None]) -> None:
        self.limit_s = limit_s
        self.interval_s = max(0.001, min(interval_s, limit_s))
        self.on = limit_s > 0 and threading.current_thread() is threading.main_thread()
        self._tick = tick
        self._stretch_s = 0.0
        if self.on:
            signal.signal(signal.SIGVTALRM, self._fired)

    def arm(self) -> None:
        # the timer's signal is handled in the main thread: a loop run on another thread is not guarded
        if self.on and threading.current_thread() is threading.main_thread():
            self._stretch_s = 0.0
            signal.setitimer(signal.ITIMER_VIRTUAL, self.interval_s, self.interval_s)

    def progress(self) -> None:
        self._stretch_s = 0.0

    def disarm(self) -> None:
        if self.on:
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)

    def _fired(self, signum: int, frame: FrameType | None) -> None:
        self._stretch_s += self.interval_s
        # raised only into a rid's own decode or parse code: never into a library (a lock held by logging or zmq
        # would stay held) nor into the worker's bookkeeping between rids; else the next firing tries again
        module = str(frame.f_globals.get("__name__", "")) if frame is not None else ""
        if self._stretch_s >= self.limit_s and module.startswith(RID_CODE_PACKAGES):
            self._stretch_s = 0.0
            raise RunawayWork(f"it took more than {self.limit_s:g} s of CPU (worker.runaway_cpu_s)")
        self._tick()


RID_CODE_PACKAGES = ("detok_worker.stream.", "detok_worker.parse.", "detok_worker.tokenizer.")


class WorkerProcess:
    """Owns the sockets and timers; all per-rid logic is in WorkerState."""

    def __init__(self, config: DetokConfig, worker_id: str, tokenizer: Tokenizer) -> None:
        self.config = config
        self.worker_id = worker_id
        self.pid = os.getpid()
        self.state = WorkerState(
            tokenizer, worker_id, StopLimits.from_config(config), config.worker.max_live_stop_chars
        )
        self.decoder = worker_decoder()
        self.metrics = WorkerMetrics(worker_id, tokenizer)
        self.sockets = BusSockets(config)
        self.to_engine = self.sockets.worker_dealer(worker_id)
        self.to_fronts = self.sockets.front_pushes()  # by front index (front.processes)
        self.rid_fronts: dict[str, int] = {}  # live rid -> its front, for rids of fronts other than 0
        self._prune_fronts = False
        self.stopping = False
        self.last_step = -1  # the last TokenBatch handled, reported in heartbeats
        self.blocked_on_front = False
        now = time.monotonic()
        self._next_heartbeat = now
        self._next_stats = now
        # The idle loop sleeps until its next timer; a stop signal wakes it through this pipe.
        self._stop_wakeup = Wakeup()
        self._poller = zmq.Poller()
        self._poller.register(self.to_engine, zmq.POLLIN)
        self._poller.register(self._stop_wakeup.fileno(), zmq.POLLIN)
        self.runaway = RunawayGuard(config.worker.runaway_cpu_s, config.worker.heartbeat_interval_s, self._tick)

    def close(self) -> None:
        """After `run`, once no signal handler can call `request_stop` any more."""
        self._stop_wakeup.close()

    def request_stop(self) -> None:
        self.stopping = True
        self._stop_wakeup.set()

    def run(self) -> None:
        log.info("worker %s (pid %d) connecting to %s", self.worker_id, self.pid, self.sockets.endpoints.workers)
        self._send_engine(Hello(self.worker_id, self.pid))
        try:
            while not self.stopping:
                self._tick()
                if self.to_engine in dict(self._poller.poll(self._poll_timeout_ms())):
                    self._drain()
        finally:
            self._send_engine(Goodbye(self.worker_id))
            dropped = self.state.drop_all()
            self._sync_metrics()
            log.info("worker %s stopping (%d live rids handed back)", self.worker_id, len(dropped))
            self.sockets.close()

    # ---- receiving ------------------------------------------------------------------------------------

    def _drain(self) -> None:
        for _ in range(FRAMES_PER_WAKEUP):
            try:
                frame = recv_single_frame(self.to_engine, self.decoder)
            except zmq.Again:
                return
            received = time.perf_counter()
            message = self.decoder.decode(frame) if frame is not None else None
            if isinstance(message, TokenBatch):
                self._handle_batch(message, received)
            elif isinstance(message, Shutdown) and message.rejoin:
                self._rejoin(message.reason)
            elif isinstance(message, Shutdown):
                log.info("worker %s: shutdown requested by the engine (%s)", self.worker_id, message.reason)
                self.stopping = True
                return
            self._tick()

    def _rejoin(self, reason: str) -> None:
        """The engine does not know our rids (it restarted, or declared us dead and moved them): forget them and
        register again, instead of exiting (nothing restarts a worker started on its own)."""
        dropped = self.state.drop_all()
        self.rid_fronts.clear()
        log.warning(
            "worker %s: the engine asked to rejoin (%s); %d stale rids dropped", self.worker_id, reason, len(dropped)
        )
        self._send_engine(Hello(self.worker_id, self.pid))
        self._next_heartbeat = time.monotonic()

    def _handle_batch(self, batch: TokenBatch, received: float) -> None:
        tokens_before = self.state.tokens_in
        start = time.perf_counter()
        if (fronts := len(self.to_fronts)) > 1:
            for open_ in batch.opens:
                if 0 < open_.front < fronts:  # any other index is front 0 (the engine checks Submit.front)
                    self.rid_fronts[open_.rid] = open_.front
        self.runaway.arm()
        try:
            result = self.state.handle_batch(batch, self._batch_tick)
        finally:
            self.runaway.disarm()
        self.last_step = batch.step
        decoded = time.perf_counter()
        text_batch = result.text_batch
        if self.rid_fronts:
            self._send_per_front(text_batch)
        elif text_batch.rids:  # a batch without news (ids that complete no character) wakes no front
            self._send_front(encode(text_batch))
        if self._prune_fronts:  # forget the fronts of rids that ended without a final delta (dropped)
            live = self.state.live
            self.rid_fronts = {rid: front for rid, front in self.rid_fronts.items() if rid in live}
            self._prune_fronts = False
        for finish in result.finishes:
            self._send_engine(finish)
        self.metrics.batch(
            rids=len(batch.rids),
            tokens=self.state.tokens_in - tokens_before,
            decode_s=decoded - start,
            step_s=time.perf_counter() - received,
        )

    # ---- sending --------------------------------------------------------------------------------------

    def _send_per_front(self, batch: TextBatch) -> None:
        """One TextBatch per front with deltas."""
        rid_fronts = self.rid_fronts
        parts = split_text_batch(batch, lambda rid: rid_fronts.get(rid, 0))
        for row, extras in batch.extras.items():
            if extras.finish is not None:
                rid_fronts.pop(batch.rids[row], None)
        for front, part in parts.items():
            self._send_front(encode(part), front)

    def _send_front(self, frame: bytes, front: int = 0) -> None:
        """Blocks while the front's queue is full (backpressure), but keeps heartbeating and honours stop."""
        to_front = self.to_fronts[front]
        while True:
            try:
                to_front.send(frame, zmq.NOBLOCK)
                return
            except zmq.Again:
                if self.stopping:
                    return
                to_front.poll(BLOCKED_POLL_MS, zmq.POLLOUT)
                self.blocked_on_front = True  # heartbeats sent meanwhile say so
                self._tick()
                self.blocked_on_front = False

    def _send_engine(self, message: object) -> None:
        with contextlib.suppress(zmq.Again):  # the engine is gone or not keeping up; it re-syncs from heartbeats
            self.to_engine.send(encode(message), zmq.NOBLOCK)

    # ---- timers ---------------------------------------------------------------------------------------

    def _batch_tick(self) -> None:
        self.runaway.progress()
        self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self._send_engine(Heartbeat(self.worker_id, self.state.live_rids, self.last_step, self.blocked_on_front))
            self._next_heartbeat = now + self.config.worker.heartbeat_interval_s
        if now >= self._next_stats:
            self._send_stats()
            self._next_stats = now + self.config.worker.stats_interval_s

    def _send_stats(self) -> None:
        bad = self._bad_counts()
        stats = WorkerStats(
            worker=self.worker_id,
            pid=self.pid,
            live_rids=self.state.live_rids,
            bad_frames=dict(bad),
            tokens_in=self.state.tokens_in,
            chars_out=self.state.chars_out,
        )
        frame = encode(stats)
        for to_front in self.to_fronts:
            with contextlib.suppress(zmq.Again):  # stats are periodic; the next one will do
                to_front.send(frame, zmq.NOBLOCK)
        self._prune_fronts = bool(self.rid_fronts)  # after the batch being handled, if any (its Opens are in)
        self._sync_metrics(bad)

    def _bad_counts(self) -> Counter[str]:
        """Bad frames (the decoder's) and failed rids (the state's), by kind."""
        return Counter(self.decoder.bad_frames) + Counter(self.state.bad)

    def _sync_metrics(self, bad: Counter[str] | None = None) -> None:
        state = self.state
        bad = self._bad_counts() if bad is None else bad
        self.metrics.sync(counts=state.counts(), stops=state.stops, live_rids=state.live_rids, bad_frames=bad)

    def _poll_timeout_ms(self) -> int:
        until = min(self._next_heartbeat, self._next_stats) - time.monotonic()
        return max(0, int(until * 1000) + 1)


def run_worker(config: DetokConfig, worker_id: str | None = None) -> None:
    """Run a worker until SIGINT/SIGTERM or a Shutdown from the engine."""
    worker_id = worker_id or default_worker_id()
    record_worker_start(worker_id)
    start = time.perf_counter()
    tokenizer = load_configured_tokenizer(config)
    # Build and verify the byte-level tables now (or read them from their disk cache), or else the generic path's
    # probe (which builds the library tokenizer, as every generic step decodes through it): done lazily, the first
    # request would stall the loop (and its heartbeats) for up to a second or two. With verified tables and the
    # tokenizer's facts from disk the library tokenizer is never built here (decode_text serves logprobs and
    # parsers from the tables).
    prepare_tokenizer(tokenizer)
    observe_tokenizer_load(tokenizer, time.perf_counter() - start, "worker")
    process = WorkerProcess(config, worker_id, tokenizer)
    with stop_on_signals(process.request_stop):
        process.run()
    process.close()
