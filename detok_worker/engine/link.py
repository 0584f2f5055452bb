"""The engine's side of the detok bus, for any engine loop (the loop of docs/protocol.md section 5): the relays' to
real engines (gRPC, vLLM), the stub's.

`EngineLink` binds the engine sockets, takes the fronts' and the workers' messages (`FrontChannel`,
`WorkerChannel`), keeps the Scheduler, and on `step()` sends one TokenBatch per worker; the engine loop only
generates. Never blocks on a peer: a TokenBatch a worker cannot take now is planned again at the next step (its ids
wait in the link, `backlog(rid)` says how many), so that worker's requests pause while the others go on. Silence is
judged only after every frame waiting on the worker socket was read, and without the time this loop itself did not
run (a stall past what it was allowed to wait: `_run_timers`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TypeVar

import zmq

from detok_worker.bus.codec import encode, engine_decoder
from detok_worker.bus.messages import (
    FINISH_ERROR,
    AdapterAnswer,
    DetokParams,
    EngineStats,
    PromptCached,
    PromptLogprobs,
    Reject,
    Submit,
    TokenLogprob,
)
from detok_worker.bus.request_fields import FIELD_BY_NAME, GRPC_REFUSED_NAMES
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import DetokConfig
from detok_worker.engine.front_channel import BusNews, FrontChannel
from detok_worker.engine.plans import SubmitLimits
from detok_worker.engine.scheduler import Output, Scheduler
from detok_worker.engine.worker_channel import WorkerChannel
from detok_worker.errors import ParameterError
from detok_worker.metrics import EngineMetrics
from detok_worker.stream.stop.rules import StopLimits
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import TraceWriter, make_header

log = logging.getLogger(__name__)
R = TypeVar("R")  # a relay's request to its engine

OUTBOX_RETRY_S = 0.05
LIVENESS_MARGIN_S = 0.005  # past a worker's deadline, so that the check after the wait finds it expired
# the last step found a worker's queue full (`blocked`): ZeroMQ cannot tell when it drains, so step again this soon
BLOCKED_RETRY_S = 0.005
# how late the engine loop may come back to `poll`, past the wait it was allowed, before the excess counts as a stall
# of its own that no worker's silence is charged for (a busy loop polls every few ms)
LOOP_STALL_S = 0.25


class EngineLink:
    def __init__(
        self,
        config: DetokConfig,
        tokenizer: Tokenizer | None = None,
        *,
        eos_ids: Iterable[int] = (),
        special_ids: Iterable[int] = (),
        vocab_size: int = 0,
        served_model_name: str = "",
        max_model_len: int = 0,
        engine_version: str = "",
        system_fingerprint: str = "",
        refused_fields: Iterable[str] = GRPC_REFUSED_NAMES,
        sampling_defaults: dict[str, int | float] | None = None,
    ) -> None:
        """`tokenizer`: the served model's, whose EOS ids (beside `eos_ids`, the model's own) end requests and whose
        special ids size the prompt context; it also heads the trace of engine.record.
        `vocab_size`: the model's vocabulary size when it is larger than the tokenizer's (a padded embedding
        table): workers decode an id below it that the tokenizer lacks as no text instead of failing the request
        (Open.vocab_size). `refused_fields`: the request fields (bus/request_fields.py names) the engine does not
        pass on, which the fronts refuse; by default those the gRPC API has no field for (vLLM's engine core takes
        them all). `sampling_defaults`: the model's, which requests that leave a field out get (EngineStats). The
        others are what the fronts report of the engine (EngineStats) unless their own options say otherwise; 0 or
        "": not known."""
        engine = config.engine
        recorder = None
        if tokenizer is not None:
            eos_ids = {*eos_ids, *tokenizer.eos_token_ids}
            special_ids = tokenizer.special_token_ids
            if engine.record:
                recorder = TraceWriter(engine.record, make_header(tokenizer, f"engine:{engine.source}"))
        self.config = config
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len
        self.engine_version = engine_version
        self.system_fingerprint = system_fingerprint
        self.vocab_size = vocab_size
        self.sampling_defaults = sampling_defaults or {}
        refused = set(refused_fields)
        self.refused_fields = [name for name in FIELD_BY_NAME if name in refused]  # the table's order
        # the LoRA adapters the engine has loaded, name -> path, for the fronts (EngineStats); None: it loads none
        self.lora_adapters: dict[str, str] | None = None
        self.scheduler = Scheduler(
            heartbeat_timeout_s=engine.heartbeat_timeout_s,
            eos_ids=eos_ids,
            special_ids=special_ids,
            stop_limits=StopLimits.from_config(config),
            answer_timeout_s=engine.batch_answer_timeout_s,
            limits=SubmitLimits.from_config(config),
            vocab_size=vocab_size,
            max_live_stop_chars=config.worker.max_live_stop_chars,
        )
        self.recorder = recorder
        self.decoder = engine_decoder()
        self.metrics = EngineMetrics()
        self.sockets = BusSockets(config)
        from_front = self.sockets.engine_pull()
        to_workers = self.sockets.worker_router()
        self.fronts = FrontChannel(from_front, self.sockets.front_pushes(), self.scheduler, self.decoder, recorder)
        self.workers = WorkerChannel(
            to_workers, self.scheduler, self.decoder, recorder, config.worker.heartbeat_interval_s
        )
        self.sockets.watch_drops(from_front)
        self.sockets.watch_drops(to_workers)
        self.poller = zmq.Poller()
        self.poller.register(from_front, zmq.POLLIN)
        self.poller.register(to_workers, zmq.POLLIN)
        self.blocked = False  # the last step found a worker's queue full
        self.dropped_connections = 0
        self._news = BusNews()
        self.next_stats = time.monotonic()
        self._resume_by = self.next_stats + LOOP_STALL_S  # the loop is back in `poll` by then unless it stalled

    # ---- the engine loop's API ----------------------------------------------------------------------------

    def poll(self, timeout_s: float = 0.0) -> BusNews:
        """Wait up to timeout_s for bus traffic, take it, run the timers; the news since the last poll."""
        self._allow_wait(time.monotonic(), timeout_s)
        events = dict(self.poller.poll(max(0, int(timeout_s * 1000))))
        unread = False
        if self.workers.router in events:
            drained_at = time.monotonic()
            if self.workers.drain(self._news, drained_at):
                self.next_stats = drained_at  # a worker joined or left: the fronts learn of it now
            unread = bool(self.workers.router.getsockopt(zmq.EVENTS) & zmq.POLLIN)
        if self.fronts.pull in events:
            self.fronts.drain(self._news)
        self._run_timers(judge_liveness=not unread)
        news, self._news = self._news, BusNews()
        return news

    def _allow_wait(self, now: float, wait_s: float) -> None:
        """The loop may be away from `poll` until now + wait_s (+ LOOP_STALL_S) without that counting as a stall."""
        self._resume_by = max(self._resume_by, now + wait_s + LOOP_STALL_S)

    def _run_timers(self, judge_liveness: bool) -> None:
        """Worker liveness, the stats report when due, the fronts' outbox: what `poll` does after reading. Only `poll`
        runs them: liveness judged without reading the workers' heartbeats first would lose live workers, so it waits
        while frames are still unread (a poll takes a bounded number; the loop polls again at once: `has_news`).
        Time the loop came back later than it was allowed (`_allow_wait`) is a stall of the engine: excused."""
        now = time.monotonic()
        if (stalled := now - self._resume_by) > 0:
            self.scheduler.registry.excuse_stall(stalled)
            log.info(
                "engine: the engine loop did not run for %.2f s; worker silence in that time is not counted", stalled
            )
        self._resume_by = now + LOOP_STALL_S
        if judge_liveness:
            self.workers.expire(now)
        if now >= self.next_stats:
            self._send_stats()
            self.next_stats = now + self.config.engine.stats_interval_s
        self.fronts.flush()

    def defer(self, submits: list[Submit]) -> None:
        """Hand back Submits of the last poll that the engine loop has not started yet (a burst it takes a slice
        at a time, polling between slices): the next poll returns them first, and an Abort read meanwhile
        withdraws one as for a Submit of that poll."""
        self._news.submitted[:0] = submits

    def idle_wait_s(self) -> float:
        """How long an engine loop with nothing to do may wait for bus traffic before `poll` has timer work: the
        next stats report, the moment a worker would be judged lost if no heartbeat came meanwhile (heartbeats
        wake the loop anyway, so liveness costs no wakeup of its own), or a retry of the Rejects a stalled front
        has not taken yet."""
        now = time.monotonic()
        if self.fronts.outbox:
            wait = OUTBOX_RETRY_S
        else:
            wait = self.next_stats - now
            deadline = self.scheduler.registry.next_deadline()
            if deadline is not None:
                wait = min(wait, deadline - now + LIVENESS_MARGIN_S)
            wait = max(0.0, wait)
        self._allow_wait(now, wait)
        return wait

    def fds(self) -> list[int]:
        """For an asyncio engine loop that waits on the bus with `loop.add_reader` instead of `poll(timeout)`: the
        file descriptors (ZMQ_FD) that become readable when frames may have arrived. They are edge-triggered:
        after a `poll(0)`, ask `has_news()` and poll again while it says so."""
        return [self.fronts.pull.getsockopt(zmq.FD), self.workers.router.getsockopt(zmq.FD)]

    def has_news(self) -> bool:
        """A `poll(0)` now would return news (a poll takes a bounded number of frames per socket)."""
        if self._news.submitted or self._news.stopped or self._news.adapter_calls:
            return True
        return any(socket.getsockopt(zmq.EVENTS) & zmq.POLLIN for socket in (self.fronts.pull, self.workers.router))

    def accept(self, submit: Submit) -> DetokParams | None:
        """Take a request; its ids come by `push` as the engine generates them. Returns its DetokParams
        (stop_token_ids: the ids the engine should stop at, EOS included unless ignore_eos), or None when it was
        rejected (the front is told)."""
        rid, prompt_ids, params = submit.rid, submit.prompt_ids, submit.params
        self.fronts.remember(rid, submit.front)
        if (reject := self.scheduler.submit(rid, prompt_ids, params)) is not None:
            self.fronts.send(reject)
            return None
        if self.recorder is not None:
            self.recorder.request(rid, prompt_ids, params)
        return self.scheduler.detok_params(rid)

    def accept_relayed(
        self, submit: Submit, build: Callable[[DetokParams], R], engine: str = ""
    ) -> tuple[DetokParams, R] | None:
        """`accept` for a relay, with its request to the engine (`build`); None when it was rejected, ends at once
        (max_tokens 0: "length"), or `build` refused a parameter (the request fails naming it and `engine`)."""
        detok = self.accept(submit)
        if detok is None or submit.params.max_tokens == 0:
            return None
        try:
            return detok, build(detok)
        except ParameterError as exc:
            self.fail(submit.rid, f"{exc} ({engine})" if engine else str(exc), param=exc.param)
            return None

    def push(
        self, rid: str, ids: list[int], finish: str | None = None, logprobs: list[TokenLogprob] | None = None
    ) -> bool:
        """New ids of an accepted request (sent at the next step); `finish` ends it. False when the rid no longer
        generates (stopped, aborted, unknown): stop generating it. `logprobs`: one per id, for a request that asked
        for them (SamplingParams.logprobs set); ignored otherwise."""
        return self.scheduler.push(rid, ids, finish, logprobs)

    def push_all(self, outputs: Iterable[Output]) -> list[str]:
        """`push` of one engine step's outputs; the rids that no longer generate."""
        return self.scheduler.push_all(outputs)

    def send_prompt_info(self, message: PromptLogprobs | PromptCached) -> None:
        """What the engine tells of a request's prompt when the request asked (its prompt logprobs, how much of it
        was cached), once: to the rid's front directly, in order with the rid's Rejects; it leaves at the next step."""
        self.fronts.send(message)

    def backlog(self, rid: str) -> int:
        """Ids pushed for `rid` that its worker has not taken yet (pause a rid with a big one)."""
        return self.scheduler.backlog(rid)

    def fail(self, rid: str, error: str, *, param: str | None = None) -> None:
        """End a request with an error the client sees (the engine failed it; `param`: the request parameter it
        cannot honour); its worker frees it. The Reject leaves now; the worker's own final delta, which the next
        step causes, carries the same message (the two reach the front on different connections)."""
        if self.scheduler.drop(rid, FINISH_ERROR, error):
            self.fronts.send(Reject(rid, error, param))
            self.fronts.flush()
            if self.recorder is not None:
                self.recorder.tokens(rid, [], "error")

    def step(self) -> int:
        """Send one TokenBatch per worker with work; how many were sent."""
        plan = self.scheduler.plan_step(time.monotonic(), time.time_ns())
        for reject in plan.rejects:
            self._news.stopped.append(reject.rid)
            self.fronts.send(reject)
        sent = 0
        blocked_before = self.workers.blocked_sends
        recorder = self.recorder
        for worker_plan in plan.workers:
            self.fronts.address_opens(worker_plan.batch.opens)
            if self.workers.send(worker_plan.worker.encode("utf-8"), worker_plan.batch):
                emitted = self.scheduler.commit(worker_plan, report=recorder is not None)
                sent += 1
                if recorder is not None:
                    for item in emitted:
                        recorder.tokens(item.rid, item.ids, item.finish)
        self.blocked = self.workers.blocked_sends > blocked_before
        self.fronts.flush()
        return sent

    def answer(self, answer: AdapterAnswer, front: int) -> None:
        """Answer a front's AdapterCall (`front`: its AdapterCall.front); it leaves now, in order with that front's
        Rejects, and the table it carries is the one the next EngineStats report."""
        self.fronts.send_to(front, answer)
        self.fronts.flush()

    def close(self) -> None:
        self.sockets.close()
        if self.recorder is not None:
            self.recorder.close()

    # ---- stats -----------------------------------------------------------------------------------------

    def _send_stats(self) -> None:
        scheduler = self.scheduler
        if dropped := self.sockets.dropped_connections():
            self.dropped_connections += dropped
            expected = min(dropped, self.workers.goodbyes)  # workers leaving gracefully close their connection
            self.workers.goodbyes -= expected
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
            lost_workers=scheduler.lost_workers,
            dropped_connections=self.dropped_connections,
            served_model_name=self.served_model_name,
            max_model_len=self.max_model_len,
            engine_version=self.engine_version,
            vocab_size=self.vocab_size,
            system_fingerprint=self.system_fingerprint,
            lora_adapters=self.lora_adapters,
            refused_fields=self.refused_fields,
            sampling_defaults=self.sampling_defaults,
        )
        self.metrics.sync(live_rids=stats.live_rids, reopened=stats.reopened, bad_frames=stats.bad_frames)
        self.fronts.broadcast(encode(stats))
        self.fronts.forget_ended()
        if self.recorder is not None:  # a recording is readable while it runs, up to the last stats report
            self.recorder.flush()
