"""The engine stub process: a thin zmq poll loop around the Scheduler.

Sockets (see docs/protocol.md): PULL bound at the engine endpoint (Submit/Abort from the front), ROUTER bound at
the workers endpoint (Hello/Heartbeat/Finish/Goodbye in, TokenBatch/Shutdown out), PUSH to the front (Reject,
EngineStats). Every bad frame is counted and skipped.

Never blocks on a peer: a TokenBatch a worker cannot take now (its queue is at the high-water mark) is planned
again next step, so that worker's requests pause while the others go on; a worker that is gone (ROUTER_MANDATORY
reports it unreachable) or silent for engine.heartbeat_timeout_s loses its requests to live workers. Messages to
a stalled front wait in a bounded outbox.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import zmq

from detok_worker.bus.codec import BAD_MULTIPART, encode, engine_decoder
from detok_worker.bus.messages import (
    FINISH_STOP,
    Abort,
    Delivered,
    EngineStats,
    Finish,
    Goodbye,
    Heartbeat,
    Hello,
    Reject,
    Shutdown,
    Submit,
)
from detok_worker.bus.sockets import BusSockets, recv_single_frame
from detok_worker.config import DetokConfig
from detok_worker.metrics import EngineMetrics
from detok_worker.stop_signals import stop_on_signals
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.trace import RecordedRequest, Trace, TraceWriter, make_header, read_trace
from engine_stub.scheduler import Scheduler, StepPlan
from engine_stub.sources import TokenSource, create_source

log = logging.getLogger(__name__)

MAX_POLL_MS = 100
MIN_IDLE_WAIT_NS = 1_000_000
BLOCKED_RETRY_NS = 5_000_000
FRAMES_PER_WAKEUP = 1024
FRONT_OUTBOX_LIMIT = 100_000
BAD_UNEXPECTED = "unexpected"  # a valid message on the wrong socket (e.g. Hello at the front's PULL)
BAD_SOURCE = "source_error"
BAD_WORKER_ID = "worker_id"  # a worker message whose routing id is not a UTF-8 worker id
STALE_WORKER = "you hold requests this engine does not know (declared dead, or the engine restarted)"


class ReplayFeed:
    """Feeds a trace's requests into the scheduler at their recorded times (scaled by speed; 0 = all at once).
    The clock starts when the first worker is alive, so early requests are not rejected."""

    def __init__(self, trace: Trace, speed: float) -> None:
        self.requests = deque(sorted(trace.requests, key=lambda r: r.t_ns))
        self.speed = speed
        self.base_ns = self.requests[0].t_ns if self.requests else 0
        self.start_ns: int | None = None

    @property
    def done(self) -> bool:
        return not self.requests

    def due(self, now_ns: int) -> list[RecordedRequest]:
        if self.start_ns is None:
            self.start_ns = now_ns
        due = []
        while self.requests and (self.speed == 0 or self.at(self.requests[0].t_ns) <= now_ns):
            due.append(self.requests.popleft())
        return due

    def next_arrival_ns(self) -> int | None:
        """When the next request is due (monotonic ns); None before the clock started or when all are in."""
        if self.start_ns is None or not self.requests:
            return None
        return self.start_ns if self.speed == 0 else self.at(self.requests[0].t_ns)

    def at(self, t_ns: int) -> int:
        assert self.start_ns is not None
        return self.start_ns + int((t_ns - self.base_ns) / self.speed)

    def release_times(self, request: RecordedRequest) -> list[int] | None:
        return None if self.speed == 0 else [self.at(t) for t in request.token_times_ns]


class EngineProcess:
    def __init__(
        self,
        config: DetokConfig,
        tokenizer: Any,
        source: TokenSource,
        *,
        replay: Trace | None = None,
        exit_after_replay: bool = False,
    ) -> None:
        engine = config.engine
        self.config = config
        self.source = source
        self.scheduler = Scheduler(
            max_batch=engine.max_batch,
            tokens_per_step=engine.tokens_per_step,
            heartbeat_timeout_s=engine.heartbeat_timeout_s,
            eos_ids=tokenizer.eos_token_ids,
        )
        self.replay = ReplayFeed(replay, engine.replay_speed) if replay is not None else None
        self.exit_after_replay = exit_after_replay
        self.recorder = (
            TraceWriter(engine.record, make_header(tokenizer, f"engine:{engine.source}")) if engine.record else None
        )
        self.decoder = engine_decoder()
        self.metrics = EngineMetrics()
        self.sockets = BusSockets(config)
        self.from_front = self.sockets.engine_pull()
        self.workers = self.sockets.worker_router()
        self.to_front = self.sockets.front_push()
        self.poller = zmq.Poller()
        self.poller.register(self.from_front, zmq.POLLIN)
        self.poller.register(self.workers, zmq.POLLIN)
        self.front_outbox: deque[bytes] = deque()
        self.step_interval_s = engine.step_interval_ms / 1000.0
        self.stopping = False
        self.steps = 0
        now = time.monotonic()
        self._next_step = now
        self._next_stats = now
        self._idle_step = False  # the last step emitted nothing: wait for news instead of spinning
        self._blocked = False  # the last step found a worker's queue full
        self.blocked_sends = 0

    def request_stop(self) -> None:
        self.stopping = True

    def run(self) -> None:
        endpoints = self.sockets.endpoints
        log.info("engine: submits at %s, workers at %s", endpoints.engine, endpoints.workers)
        try:
            while not self.stopping:
                events = dict(self.poller.poll(self._poll_timeout_ms()))
                if self.from_front in events:
                    self._drain_front()
                # After the front: a slow source (llama-cpp generates in plan()) must not make the heartbeats that
                # queued meanwhile look missed.
                if self.workers in events or self.from_front in events:
                    self._drain_workers()
                self._tick()
                if self._replay_finished():
                    break
        finally:
            self.sockets.close()
            if self.recorder is not None:
                self.recorder.close()

    def _replay_finished(self) -> bool:
        replay = self.replay
        return self.exit_after_replay and replay is not None and replay.done and not self.scheduler.has_work()

    # ---- incoming ---------------------------------------------------------------------------------------

    def _drain_front(self) -> None:
        for _ in range(FRAMES_PER_WAKEUP):
            try:
                frame = recv_single_frame(self.from_front, self.decoder)
            except zmq.Again:
                return
            message = self.decoder.decode(frame) if frame is not None else None
            if isinstance(message, Submit):
                self._submit(message)
            elif isinstance(message, Abort):
                if self.scheduler.abort(message.rid) and self.recorder is not None:
                    self.recorder.tokens(message.rid, [], message.reason)
            elif isinstance(message, Delivered):
                self.scheduler.delivered(message.rid)
            elif message is not None:
                self.decoder.count_bad(BAD_UNEXPECTED, type(message).__name__)

    def _drain_workers(self) -> None:
        now = time.monotonic()
        for _ in range(FRAMES_PER_WAKEUP):
            try:
                parts = self.workers.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.decoder.count_bad(BAD_MULTIPART, f"{len(parts)} parts")
                continue
            identity, frame = parts
            try:
                worker = identity.decode("utf-8")
            except UnicodeDecodeError:  # a DEALER without ROUTING_ID: nothing could be routed back to it by name
                self.decoder.count_bad(BAD_WORKER_ID, identity)
                continue
            message = self.decoder.decode(frame)
            if isinstance(message, Heartbeat):
                if not self.scheduler.heartbeat(worker, message.load, now):
                    self._send_worker(identity, Shutdown(STALE_WORKER))
            elif isinstance(message, Finish):
                if self.scheduler.finish(message.rid, worker) and self.recorder is not None:
                    self.recorder.tokens(message.rid, [], message.reason)
            elif isinstance(message, Hello):
                log.info("engine: worker %s (pid %d) is alive", worker, message.pid)
                self.scheduler.hello(worker, message.pid, now)
            elif isinstance(message, Goodbye):
                log.info("engine: worker %s leaves", worker)
                self.scheduler.goodbye(worker)
            elif message is not None:
                self.decoder.count_bad(BAD_UNEXPECTED, type(message).__name__)

    def _submit(self, message: Submit) -> None:
        try:
            plan = self.source.plan(message.rid, message.prompt_ids, message.params)
        except Exception as exc:  # noqa: BLE001 - a source failure rejects this request only
            self.decoder.count_bad(BAD_SOURCE, exc)
            self._to_front(Reject(message.rid, f"the engine's token source failed: {exc}"))
            return
        release = None
        if plan.offsets_ns is not None:
            now_ns = time.monotonic_ns()
            release = [now_ns + offset for offset in plan.offsets_ns]
        self._add_request(message.rid, message.prompt_ids, message.params, plan.ids, release_ns=release)

    def _add_request(self, rid: str, prompt_ids: list[int], params: Any, planned: list[int], **kwargs: Any) -> None:
        reject = self.scheduler.submit(rid, prompt_ids, params, planned, **kwargs)
        if reject is not None:
            self._to_front(reject)
        elif self.recorder is not None:
            self.recorder.request(rid, prompt_ids, params)

    # ---- timers and steps ---------------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        for worker in self.scheduler.expire_workers(now):
            log.warning("engine: worker %s missed its heartbeats; re-opening its requests elsewhere", worker)
        self._feed_replay()
        if now >= self._next_step and self.scheduler.has_work():
            self._step(now)
            self._next_step = now + self.step_interval_s
        if now >= self._next_stats:
            self._send_stats()
            self._next_stats = now + self.config.engine.stats_interval_s
        self._flush_front()

    def _feed_replay(self) -> None:
        if self.replay is None or self.replay.done or not self.scheduler.live_workers():
            return
        for request in self.replay.due(time.monotonic_ns()):
            release = self.replay.release_times(request)
            finish = request.finish or FINISH_STOP
            self._add_request(
                request.rid, request.prompt_ids, request.params, request.output_ids, release_ns=release, finish=finish
            )

    def _step(self, now: float) -> None:
        plan: StepPlan = self.scheduler.plan_step(now, time.monotonic_ns(), time.time_ns())
        for reject in plan.rejects:
            self._to_front(reject)
        sent = 0
        blocked_before = self.blocked_sends
        for worker_plan in plan.workers:
            if self._send_worker(worker_plan.worker.encode("utf-8"), worker_plan.batch):
                emitted = self.scheduler.commit(worker_plan, report=self.recorder is not None)
                sent += 1
                if self.recorder is not None:
                    for item in emitted:
                        self.recorder.tokens(item.rid, item.ids, item.finish)
        self.steps += 1
        self._idle_step = sent == 0
        self._blocked = self.blocked_sends > blocked_before

    def _send_worker(self, identity: bytes, message: object) -> bool:
        try:
            self.workers.send_multipart([identity, encode(message)], zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.blocked_sends += 1  # its queue is full: retried next step
            return False
        except zmq.ZMQError as exc:
            worker = identity.decode("utf-8", "replace")
            log.warning("engine: cannot send to worker %s (%s); re-opening its requests elsewhere", worker, exc)
            self.scheduler.worker_unreachable(worker)
            return False

    def _poll_timeout_ms(self) -> int:
        """Sleep until the next step, stats or replay arrival; after a step that could emit nothing (paced ids
        not due, worker queues full, no worker) wait for news or the next paced id instead of spinning."""
        now_ns = time.monotonic_ns()
        deadline_ns = int(self._next_stats * 1e9)
        if self.scheduler.has_work():
            if self._idle_step:
                release = self.scheduler.next_release_ns()
                wait_ns = MAX_POLL_MS * 1_000_000 if release is None else release - now_ns
                if self._blocked:  # a worker's queue was full: ZeroMQ cannot tell when it drains, so retry soon
                    wait_ns = min(wait_ns, BLOCKED_RETRY_NS)
                deadline_ns = min(deadline_ns, now_ns + max(MIN_IDLE_WAIT_NS, wait_ns))
            else:
                deadline_ns = min(deadline_ns, int(self._next_step * 1e9))
        if self.replay is not None and (arrival := self.replay.next_arrival_ns()) is not None:
            deadline_ns = min(deadline_ns, arrival)
        return max(0, min(MAX_POLL_MS, -(-(deadline_ns - now_ns) // 1_000_000)))

    # ---- to the front -------------------------------------------------------------------------------------

    def _to_front(self, message: object) -> None:
        if len(self.front_outbox) < FRONT_OUTBOX_LIMIT:
            self.front_outbox.append(encode(message))

    def _flush_front(self) -> None:
        while self.front_outbox:
            try:
                self.to_front.send(self.front_outbox[0], zmq.NOBLOCK)
            except zmq.Again:
                return
            self.front_outbox.popleft()

    def _send_stats(self) -> None:
        bad = Counter(self.decoder.bad_frames)
        bad.update(self.scheduler.bad)
        stats = EngineStats(
            live_rids=self.scheduler.live_rids,
            workers=self.scheduler.worker_loads(),
            bad_frames=dict(bad),
            aborted=self.scheduler.aborted,
            reopened=self.scheduler.reopened,
        )
        self.metrics.sync(live_rids=stats.live_rids, reopened=stats.reopened, bad_frames=stats.bad_frames)
        with contextlib.suppress(zmq.Again):  # periodic; the next one will do
            self.to_front.send(encode(stats), zmq.NOBLOCK)


def run_engine(
    config: DetokConfig,
    replay: Trace | str | Path | None = None,
    *,
    exit_after_replay: bool = False,
) -> None:
    """Run the engine stub until SIGINT/SIGTERM. With `replay` (a Trace or a trace file) the trace's own requests
    are generated at their recorded times (engine.replay_speed) in addition to any Submits from a front; with
    exit_after_replay the engine returns once they have all ended."""
    tokenizer = load_configured_tokenizer(config)
    source = create_source(config, tokenizer)
    trace = read_trace(replay) if isinstance(replay, (str, Path)) else replay
    process = EngineProcess(config, tokenizer, source, replay=trace, exit_after_replay=exit_after_replay)
    with stop_on_signals(process.request_stop):
        process.run()
