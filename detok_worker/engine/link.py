"""The engine's side of the detok bus, for any engine loop: the stub's, the gRPC gateway's, a real scheduler's.

`EngineLink` binds the engine sockets (docs/protocol.md), takes Submit/Abort/Delivered from the front and
Hello/Heartbeat/Finish/Goodbye from workers, keeps the Scheduler (worker registry, rid -> worker assignment,
re-open on worker loss, Delivered bookkeeping), and on `step()` sends one TokenBatch per worker. The engine loop
only generates:

    link = EngineLink(config, eos_ids=tokenizer.eos_token_ids, special_ids=tokenizer.special_token_ids)
    while running:
        news = link.poll(0.005)
        for submit in news.submitted:               # new requests: accept, then generate them
            if (detok := link.accept(submit)) is not None:
                engine.add(submit.rid, submit.prompt_ids, submit.params.max_tokens, detok.stop_token_ids,
                           detok.min_tokens)
        for rid in news.stopped:                    # aborted by the client, stopped by a worker (stop string)
            engine.cancel(rid)
        for rid, new_ids, finish in engine.step():  # one decode step: the new ids of every running request
            link.push(rid, new_ids, finish)
        link.step()                                 # one TokenBatch per worker

Never blocks on a peer: a TokenBatch a worker cannot take now is planned again at the next step (its ids wait in
the link, `backlog(rid)` says how many), so that worker's requests pause while the others go on; a worker that
is gone (ROUTER_MANDATORY reports it unreachable) or silent for engine.heartbeat_timeout_s loses its requests
to live workers. Messages to a stalled front wait in a bounded outbox. Every bad frame is counted and skipped.
With several front processes (front.processes) the link remembers each rid's Submit.front: it goes into the rid's
Opens (the worker sends the rid's text there) and the rid's Reject goes there; a FrontHello aborts the rids of
that front index (its earlier process died with their clients).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import zmq

from detok_worker.bus.codec import BAD_MULTIPART, encode, engine_decoder
from detok_worker.bus.messages import (
    FINISH_ERROR,
    Abort,
    Delivered,
    DetokParams,
    EngineStats,
    Finish,
    FrontHello,
    Goodbye,
    Heartbeat,
    Hello,
    Reject,
    Shutdown,
    Submit,
    TokenLogprob,
)
from detok_worker.bus.sockets import BusSockets, recv_single_frame
from detok_worker.config import DetokConfig
from detok_worker.engine.limits import SubmitLimits
from detok_worker.engine.scheduler import Scheduler
from detok_worker.metrics import EngineMetrics
from detok_worker.stream.stop.rules import StopLimits
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import TraceWriter, make_header

log = logging.getLogger(__name__)

FRAMES_PER_WAKEUP = 1024
FRONT_OUTBOX_LIMIT = 100_000
BAD_UNEXPECTED = "unexpected"  # a valid message on the wrong socket (e.g. Hello at the front's PULL)
BAD_SOURCE = "source_error"
BAD_FRONT_INDEX = "front_index"  # a Submit/FrontHello naming a front index outside front.processes
BAD_WORKER_ID = "worker_id"  # a worker message whose routing id is not a UTF-8 worker id
STALE_WORKER = "you hold requests this engine does not know (declared dead, or the engine restarted)"


@dataclass(slots=True)
class BusNews:
    """What happened on the bus since the last poll."""

    submitted: list[Submit] = field(default_factory=list)  # new requests, not yet accepted
    stopped: list[str] = field(default_factory=list)  # rids to stop generating (abort, worker Finish, reject)


def recorder_for(config: DetokConfig, tokenizer: Tokenizer) -> TraceWriter | None:
    """The trace recorder of engine.record ("" = none)."""
    engine = config.engine
    return TraceWriter(engine.record, make_header(tokenizer, f"engine:{engine.source}")) if engine.record else None


class EngineLink:
    def __init__(
        self,
        config: DetokConfig,
        *,
        eos_ids: Iterable[int] = (),
        special_ids: Iterable[int] = (),
        recorder: TraceWriter | None = None,
    ) -> None:
        engine = config.engine
        self.config = config
        self.scheduler = Scheduler(
            max_batch=engine.max_batch,
            tokens_per_step=engine.tokens_per_step,
            heartbeat_timeout_s=engine.heartbeat_timeout_s,
            eos_ids=eos_ids,
            special_ids=special_ids,
            stop_limits=StopLimits.from_config(config),
            answer_timeout_s=engine.batch_answer_timeout_s,
            limits=SubmitLimits.from_config(config),
        )
        self.recorder = recorder
        self.decoder = engine_decoder()
        self.metrics = EngineMetrics()
        self.sockets = BusSockets(config)
        self.from_front = self.sockets.engine_pull()
        self.workers = self.sockets.worker_router()
        self.to_fronts = self.sockets.front_pushes()  # by front index (front.processes)
        self.to_front = self.to_fronts[0]
        # rid -> front index, for rids of fronts other than 0: set on their Opens, where their Rejects go
        self.rid_fronts: dict[str, int] = {}
        self.sockets.watch_drops(self.from_front)
        self.sockets.watch_drops(self.workers)
        self.poller = zmq.Poller()
        self.poller.register(self.from_front, zmq.POLLIN)
        self.poller.register(self.workers, zmq.POLLIN)
        self.front_outbox: deque[tuple[int, bytes]] = deque()  # (front index, frame)
        self.steps = 0
        self.blocked = False  # the last step found a worker's queue full
        self.blocked_sends = 0
        self.dropped_connections = 0
        self._goodbyes = 0  # workers that said Goodbye and whose connection has not closed yet (an expected drop)
        self._news = BusNews()
        self.next_stats = time.monotonic()

    # ---- the engine loop's API ----------------------------------------------------------------------------

    def poll(self, timeout_s: float = 0.0) -> BusNews:
        """Wait up to timeout_s for bus traffic, take all of it, run the timers (worker liveness, stats);
        returns the news since the last poll."""
        events = dict(self.poller.poll(max(0, int(timeout_s * 1000))))
        if self.workers in events:
            self._drain_workers()
        if self.from_front in events:
            self._drain_front()
        now = time.monotonic()
        for worker in self.scheduler.expire_workers(now):
            log.warning(
                "engine: worker %s missed its heartbeats or left its TokenBatches unanswered for "
                "engine.batch_answer_timeout_s; re-opening its requests elsewhere",
                worker,
            )
        if now >= self.next_stats:
            self._send_stats()
            self.next_stats = now + self.config.engine.stats_interval_s
        self._flush_front()
        news, self._news = self._news, BusNews()
        return news

    def accept(
        self,
        submit: Submit,
        planned: list[int] | None = None,
        *,
        release_ns: list[int] | None = None,
        finish: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> DetokParams | None:
        """Take a request. Its ids come by `push` as the engine generates them, or are all `planned` now (the
        stub's sources; release_ns paces them). Returns its DetokParams (stop_token_ids: the ids the engine
        should stop at, EOS included unless ignore_eos), or None when it was rejected (the front is told)."""
        rid, prompt_ids, params, front = submit.rid, submit.prompt_ids, submit.params, submit.front
        if front:
            self.rid_fronts[rid] = front
        if planned is None:
            reject = self.scheduler.submit(rid, prompt_ids, params, [], pushed=True)
        else:
            reject = self.scheduler.submit(
                rid, prompt_ids, params, planned, release_ns=release_ns, finish=finish, logprobs=logprobs
            )
        if reject is not None:
            self._to_front(reject)
            return None
        if self.recorder is not None:
            self.recorder.request(rid, prompt_ids, params)
        return self.scheduler.detok_params(rid)

    def push(
        self, rid: str, ids: list[int], finish: str | None = None, logprobs: list[TokenLogprob] | None = None
    ) -> bool:
        """New ids of an accepted request (sent at the next step); `finish` ends it. False when the rid no longer
        generates (stopped, aborted, unknown): stop generating it. `logprobs`: one per id, for a request that asked
        for them (SamplingParams.logprobs set); ignored otherwise."""
        return self.scheduler.push(rid, ids, finish, logprobs)

    def backlog(self, rid: str) -> int:
        """Ids pushed for `rid` that its worker has not taken yet (backpressure: pause a rid with a big one)."""
        return self.scheduler.backlog(rid)

    def fail(self, rid: str, error: str, *, param: str | None = None) -> None:
        """End a request with an error the client sees (the engine failed it; `param`: the request parameter it
        cannot honour); its worker frees it. The Reject leaves now; the worker's own final delta, which the next
        step causes, carries the same message (the two reach the front on different connections)."""
        if self.scheduler.drop(rid, FINISH_ERROR, error):
            self._to_front(Reject(rid, error, param))
            self._flush_front()
            if self.recorder is not None:
                self.recorder.tokens(rid, [], "error")

    def step(self) -> int:
        """Send one TokenBatch per worker with work; returns how many were sent."""
        plan = self.scheduler.plan_step(time.monotonic(), time.monotonic_ns(), time.time_ns())
        for reject in plan.rejects:
            self._news.stopped.append(reject.rid)
            self._to_front(reject)
        sent = 0
        blocked_before = self.blocked_sends
        recorder = self.recorder
        rid_fronts = self.rid_fronts
        for worker_plan in plan.workers:
            if rid_fronts:
                for open_ in worker_plan.batch.opens:
                    open_.front = rid_fronts.get(open_.rid, 0)
            if self._send_worker(worker_plan.worker.encode("utf-8"), worker_plan.batch):
                emitted = self.scheduler.commit(worker_plan, report=recorder is not None)
                sent += 1
                if recorder is not None:
                    for item in emitted:
                        recorder.tokens(item.rid, item.ids, item.finish)
        self.steps += 1
        self.blocked = self.blocked_sends > blocked_before
        self._flush_front()
        return sent

    def reject(self, rid: str, error: str, *, front: int = 0) -> None:
        """Refuse a request that was never accepted (e.g. the token source failed for it); `front`: its
        Submit.front."""
        self._to_front(Reject(rid, error), front)

    def close(self) -> None:
        self.sockets.close()
        if self.recorder is not None:
            self.recorder.close()

    # ---- incoming ---------------------------------------------------------------------------------------

    def _drain_front(self) -> None:
        scheduler = self.scheduler
        for _ in range(FRAMES_PER_WAKEUP):
            try:
                frame = recv_single_frame(self.from_front, self.decoder)
            except zmq.Again:
                return
            message = self.decoder.decode(frame) if frame is not None else None
            if isinstance(message, (Submit, FrontHello)) and not 0 <= message.front < len(self.to_fronts):
                self.decoder.count_bad(BAD_FRONT_INDEX, message.front)  # no such front: nowhere to answer
            elif isinstance(message, Submit):
                self._news.submitted.append(message)
            elif isinstance(message, FrontHello):
                self._front_restarted(message)
            elif isinstance(message, Abort):
                if scheduler.abort(message.rid):
                    self._news.stopped.append(message.rid)
                    if self.recorder is not None:
                        self.recorder.tokens(message.rid, [], message.reason)
                else:
                    self._withdraw(message.rid)
            elif isinstance(message, Delivered):
                scheduler.delivered(message.rid)
            elif message is not None:
                self.decoder.count_bad(BAD_UNEXPECTED, type(message).__name__)

    def _front_restarted(self, hello: FrontHello) -> None:
        """The requests of an earlier process at this front index lost their clients with it: abort them."""
        scheduler, rid_fronts = self.scheduler, self.rid_fronts
        live = [r.rid for r in (*scheduler.running.values(), *scheduler.waiting)]
        rids = [rid for rid in live if rid_fronts.get(rid, 0) == hello.front]
        rids += [submit.rid for submit in self._news.submitted if submit.front == hello.front]
        for rid in rids:
            if scheduler.abort(rid):
                self._news.stopped.append(rid)
            else:
                self._withdraw(rid)
            self.rid_fronts.pop(rid, None)
        log.info(
            "engine: front %d (pid %d) is up; %d requests of its predecessor aborted", hello.front, hello.pid, len(rids)
        )

    def _withdraw(self, rid: str) -> None:
        """An Abort for a request submitted in the same poll, not accepted yet: it never starts."""
        submitted = self._news.submitted
        for index, submit in enumerate(submitted):
            if submit.rid == rid:
                del submitted[index]
                self.scheduler.aborted += 1
                return

    def _drain_workers(self) -> None:
        now = time.monotonic()
        scheduler = self.scheduler
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
                if not scheduler.heartbeat(worker, message.load, now, message.step, message.blocked):
                    self._send_worker(identity, Shutdown(STALE_WORKER, rejoin=True))
            elif isinstance(message, Finish):
                if scheduler.finish(message.rid, worker):
                    self._news.stopped.append(message.rid)
                    if self.recorder is not None:
                        self.recorder.tokens(message.rid, [], message.reason)
            elif isinstance(message, Hello):
                log.info("engine: worker %s (pid %d) is alive", worker, message.pid)
                scheduler.hello(worker, message.pid, now)
                self.next_stats = now  # the front learns of a new worker now, not at the next stats interval
            elif isinstance(message, Goodbye):
                log.info("engine: worker %s leaves", worker)
                scheduler.goodbye(worker)
                self._goodbyes += 1
                self.next_stats = now
            elif message is not None:
                self.decoder.count_bad(BAD_UNEXPECTED, type(message).__name__)

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

    # ---- to the front -------------------------------------------------------------------------------------

    def _to_front(self, message: Reject, front: int | None = None) -> None:
        if len(self.front_outbox) < FRONT_OUTBOX_LIMIT:
            if front is None:
                front = self.rid_fronts.get(message.rid, 0) if self.rid_fronts else 0
            self.front_outbox.append((front, encode(message)))

    def _flush_front(self) -> None:
        while self.front_outbox:
            front, frame = self.front_outbox[0]
            try:
                self.to_fronts[front].send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return
            self.front_outbox.popleft()

    def _send_stats(self) -> None:
        scheduler = self.scheduler
        if dropped := self.sockets.dropped_connections():
            self.dropped_connections += dropped
            expected = min(dropped, self._goodbyes)  # workers leaving gracefully close their connection
            self._goodbyes -= expected
            log.log(
                logging.WARNING if dropped > expected else logging.INFO,
                "engine: %d bus connection(s) dropped (%d so far, %d of them workers that said goodbye): a frame "
                "over bus.max_message_bytes, or a peer that went away",
                dropped,
                self.dropped_connections,
                expected,
            )
        bad = Counter(self.decoder.bad_frames)
        bad.update(scheduler.bad)
        stats = EngineStats(
            live_rids=scheduler.live_rids,
            workers=scheduler.worker_loads(),
            bad_frames=dict(bad),
            aborted=scheduler.aborted,
            reopened=scheduler.reopened,
            generated=scheduler.generated,
            dropped_connections=self.dropped_connections,
        )
        self.metrics.sync(live_rids=stats.live_rids, reopened=stats.reopened, bad_frames=stats.bad_frames)
        frame = encode(stats)
        for to_front in self.to_fronts:
            with contextlib.suppress(zmq.Again):  # periodic; the next one will do
                to_front.send(frame, zmq.NOBLOCK)
        if self.rid_fronts:  # forget the fronts of rids the engine no longer holds
            known, ended = scheduler.has_rid, scheduler.delivering  # an ended rid may be re-opened
            self.rid_fronts = {rid: front for rid, front in self.rid_fronts.items() if known(rid) or rid in ended}
