"""The front's side of the bus: Submit/Abort/AdapterCall out to the engine, TextBatch/WorkerStats/Reject/
PromptLogprobs/EngineStats/AdapterAnswer in.

Each live request has a RequestStream: its text not yet taken by its HTTP handler (or, for a plain text stream whose
response writes from here, not yet taken by its connection), plus the request's end state. Deltas go through
bus/reassembly.py (each character exactly once; a gap fails the request). The text buffered for clients that do
not read is bounded (output_budget.py); so is a request's life (front.request_timeout_s). When the engine goes
away (its connection closes, or its EngineStats stop for ENGINE_STALE_S) every live request ends at once with an
`engine_lost` error: the new engine that may come up does not know them.

Outgoing frames go through the EngineOutbox (engine_outbox.py): in order, so a rid's Abort never overtakes its
Submit. When a rid's final delta arrives the engine is told (Delivered): until then it keeps the rid, to re-open it
should its worker die with the final text still inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections import Counter
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from detok_worker.bus.codec import encode, front_decoder
from detok_worker.bus.columns import row_runs, text_row
from detok_worker.bus.messages import (
    Abort,
    AdapterAnswer,
    AdapterCall,
    Delivered,
    EngineStats,
    FrontHello,
    PromptCached,
    PromptLogprobs,
    Reject,
    RequestParams,
    Submit,
    TextBatch,
    WorkerStats,
)
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import DetokConfig
from detok_worker.front.engine_outbox import EngineOutbox
from detok_worker.front.errors import ENGINE_ERROR, SERVER_ERROR, SERVICE_UNAVAILABLE, TIMEOUT, APIError, reject_error
from detok_worker.front.front_stats import all_fronts, front_totals, write_snapshot
from detok_worker.front.output_budget import OutputBudget
from detok_worker.front.request_stream import RequestStream
from detok_worker.metrics import FrontMetrics, multiprocess_dir
from detok_worker.process.logs import RateLimiter, warn_rate_limited
from detok_worker.stream.stop.rules import StopRules

log = logging.getLogger(__name__)

# EngineStats arrive every engine.stats_interval_s (1 s); older than this = engine gone. An engine that exits is
# seen at once (its connection closes); this catches a hung one, and must not catch one starved of CPU for seconds
# (beside a CPU engine core that takes every core it can).
ENGINE_STALE_S = 10.0
# After the engine's connection closed, how long its last frames (the Rejects of the requests it failed on its way
# out, its workers' last rows) may take to arrive on the other connections before the rest is failed
ENGINE_GONE_GRACE_S = 0.25
SWEEP_INTERVAL_S = 1.0
MAX_FRAMES_PER_WAKEUP = 256
SHUTTING_DOWN = APIError(503, "the server is shutting down", type=SERVICE_UNAVAILABLE, code="shutdown")
_repeated_faults = RateLimiter(interval_s=10.0)  # faults that can repeat per frame are logged once per 10 s


class Dispatcher:
    """Owns the front's two bus sockets, the rid -> RequestStream table and the latest engine/worker stats."""

    def __init__(self, config: DetokConfig, index: int = 0) -> None:
        self.config = config
        self.index = index  # which front process this is (front.processes > 1)
        # where the fronts share their /stats sections (front_stats.py): only when there are several
        self._shared_dir = multiprocess_dir() if config.front.processes > 1 else None
        self._streams: dict[str, RequestStream] = {}
        # streams that asked for prompt logprobs, until they come (the engine sends them apart from the text)
        self._prompt_waiting: dict[str, RequestStream] = {}
        self._decoder = front_decoder()
        self._engine: tuple[EngineStats, float] | None = None
        self.engine_model_name = ""  # the model name the engine serves, once its EngineStats named one
        self.engine_version = ""  # the real engine's version, once its EngineStats gave one
        self.system_fingerprint = ""  # the real engine's system_fingerprint, once its EngineStats gave one
        self.engine_vocab_size = 0  # the model's vocabulary size, once its EngineStats gave one
        self.engine_sampling_defaults: dict[str, int | float] = {}  # the model's, as its EngineStats gave them
        # the request fields the engine does not pass on (its EngineStats), in the table's order: requests that
        # set one are refused. Before its first stats a request is refused anyway (the engine is not reachable)
        self.engine_refuses: tuple[str, ...] = ()
        self.engine_max_model_len = 0  # the engine's context length, once its EngineStats reported one
        # the LoRA adapters served as models, name -> path: front.lora_adapters, then the engine's table once it
        # reports one (adapters it loads and unloads at run time); updated in place (Limits holds a view of it)
        self.lora_adapters: dict[str, str] = dict(config.front.lora_adapters)
        self._adapter_calls: dict[str, asyncio.Future[AdapterAnswer]] = {}  # call id -> its answer, to come
        self._workers: dict[str, tuple[WorkerStats, float]] = {}
        self._worker_stale_s = max(2.0, 4 * config.worker.stats_interval_s)
        self.counters: Counter[str] = Counter()
        self._outbox = EngineOutbox(self.counters)
        self.metrics = FrontMetrics()
        self.budget = OutputBudget(config.front, self._streams, self.counters, self.metrics)
        self._context: zmq.asyncio.Context | None = None
        self._bus: BusSockets | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._engine_monitor: zmq.asyncio.Socket | None = None
        # the engine's connection closed and none came since: EngineStats still queued from the engine that went
        # are not a sign of life (read after the close, they would make a dead engine healthy until it went stale)
        self._engine_gone = False

    # ---- lifecycle --------------------------------------------------------------------------------------

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        self._bus = BusSockets(self.config, self._context)
        pull = self._bus.front_pull(self.index)
        push = self._bus.engine_push()
        if self.config.front.processes > 1:  # the engine aborts what a dead predecessor at this index left
            self._outbox.post(encode(FrontHello(self.index, os.getpid())))
        self._engine_monitor = push.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._tasks = [
            asyncio.create_task(self._receive_loop(pull), name="front-receive"),
            asyncio.create_task(self._outbox.run(push), name="front-send"),
            asyncio.create_task(self._sweep_loop(), name="front-sweep"),
            asyncio.create_task(self._engine_watch_loop(self._engine_monitor), name="front-engine-watch"),
        ]

    async def close(self) -> None:
        """Fail every live request, tell the engine to stop them, close the sockets."""
        self.fail_all(SHUTTING_DOWN, cause="shutdown")
        await self._outbox.flush(timeout_s=0.5)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        self._outbox.stop()
        self.flush_counters()  # what the last sweep did not write (the files outlive the process)
        if self._engine_monitor is not None:
            self._engine_monitor.close(linger=0)
            self._engine_monitor = None
        if self._bus is not None:
            self._bus.close()
            self._bus = None
        if self._context is not None:
            self._context.term()
            self._context = None

    # ---- requests ---------------------------------------------------------------------------------------

    def submit_choices(
        self,
        prompt_ids: list[int],
        choices: list[tuple[str, RequestParams]],
        stop_rules: StopRules,
        wakeup: asyncio.Event,
    ) -> list[RequestStream]:
        """Send one engine request per (rid, params) for the same prompt (the n choices of one HTTP request),
        all or none; their streams share `wakeup`."""
        if not self.engine_alive():
            raise APIError(503, "the engine is not reachable; try again later", type=SERVICE_UNAVAILABLE)
        budget = self.config.front.max_total_pending_chars
        if self.budget.over():
            self.counters["overloaded"] += 1
            message = f"the server buffers too much output for slow clients ({budget} characters); try again later"
            raise APIError(503, message, type=SERVICE_UNAVAILABLE, code="front_overloaded")
        timeout = self.config.front.request_timeout_s
        deadline = time.monotonic() + timeout if timeout else math.inf  # 0 = no deadline
        streams = []
        for rid, params in choices:
            parsed = bool(params.detok.reasoning_parser or params.detok.tool_call_parser)
            stream = RequestStream(rid, len(prompt_ids), deadline, stop_rules, parsed, wakeup)
            self._streams[rid] = stream
            if params.sampling.prompt_logprobs is not None or params.report_cached:
                self._prompt_waiting[rid] = stream
            self._outbox.post(encode(Submit(rid, prompt_ids, params, time.time_ns(), self.index)))
            self.counters["requests"] += 1
            streams.append(stream)
        return streams

    def abort(
        self,
        stream: RequestStream,
        error: APIError | None = None,
        *,
        drop_text: bool = False,
        cause: str = "client_disconnected",
    ) -> None:
        """End a live request early (client gone, too slow, timed out, shutdown) and stop it in the engine.
        With an error the stream ends failed; drop_text also frees the text its handler has not taken.
        `cause` labels the aborted-requests metric."""
        if self._streams.pop(stream.rid, None) is None:
            return
        self._outbox.post(encode(Abort(stream.rid)))
        self.counters["aborted"] += 1
        self.metrics.aborted(cause)
        if error is not None:
            stream.fail(error, drop_text=drop_text)

    def release(self, stream: RequestStream) -> None:
        """The handler of `stream` is done with it (response sent, or its client gone): its text leaves the budget."""
        self.budget.unread.pop(stream.rid, None)
        self._prompt_waiting.pop(stream.rid, None)

    def fail_all(self, error: APIError, cause: str, among: list[RequestStream] | None = None) -> int:
        """End every live request (or those of `among` still live) with `error` (shutdown, engine lost); returns how
        many there were."""
        live = self._streams
        streams = list(live.values()) if among is None else [s for s in among if live.get(s.rid) is s]
        for stream in streams:
            self.abort(stream, error, cause=cause)
        return len(streams)

    async def call_adapter(self, call: AdapterCall) -> AdapterAnswer:
        """Load or unload a LoRA adapter in the engine: its answer (the engine's table comes with it), or an
        APIError when the engine goes away first."""
        future = asyncio.get_running_loop().create_future()
        self._adapter_calls[call.call] = future
        self._outbox.post(encode(call))
        try:
            return await future
        finally:
            self._adapter_calls.pop(call.call, None)

    def _adapters_reported(self, table: dict[str, str]) -> None:
        if table != self.lora_adapters:
            self.lora_adapters.clear()
            self.lora_adapters.update(table)

    def _engine_lost(self, why: str) -> None:
        self._engine = None  # not alive until a (new) engine reports again
        self._fail_engine_requests(why)

    def _fail_engine_requests(self, why: str, among: list[RequestStream] | None = None) -> None:
        """End the live requests (those of `among` still live) and adapter calls of an engine that went away: a new
        one does not know them."""
        error = APIError(502, f"the engine went away ({why})", type=ENGINE_ERROR, code="engine_lost")
        for future in self._adapter_calls.values():
            if not future.done():
                future.set_exception(error)
        failed = self.fail_all(error, cause="engine_lost", among=among)
        log.warning("front: the engine went away (%s); %d live requests ended with an error", why, failed)

    @property
    def live_rids(self) -> int:
        return len(self._streams)

    # ---- health and stats -------------------------------------------------------------------------------

    def engine_alive(self) -> bool:
        """An engine reported and has not been judged lost. Only the sweep judges the stats' age, on a sweep that
        came on time: a front that was paused (SIGSTOP, starved of CPU) answers the requests that waited for it
        before its intake has read the stats the engine sent meanwhile, and must not refuse them for that."""
        return self._engine is not None

    def _engine_stale(self) -> bool:
        return self._engine is not None and time.monotonic() - self._engine[1] >= ENGINE_STALE_S

    def healthy(self) -> bool:
        return self._engine is not None and len(self._engine[0].workers) >= 1

    def front_section(self) -> dict[str, Any]:
        """This front's part of /stats (front_stats.py shares it with the other fronts)."""
        return {
            "index": self.index,
            "pid": os.getpid(),
            "live_rids": self.live_rids,
            "pending_chars": self.budget.recount(),  # untaken text over live and finished-but-unread requests
            "outbox": self._outbox.queued(),
            "bad_frames": dict(self._decoder.bad_frames),
            **self.counters,
        }

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        front = self.front_section()
        fronts = all_fronts(self._shared_dir, front)
        engine = None
        if self._engine is not None:
            engine = {**msgspec.structs.asdict(self._engine[0]), "age_s": round(now - self._engine[1], 3)}
        workers = {
            worker: {**msgspec.structs.asdict(stats), "age_s": round(now - seen, 3)}
            for worker, (stats, seen) in self._workers.items()
            if now - seen < self._worker_stale_s
        }
        totals = front_totals(fronts)
        return {"front": front, "fronts": fronts, "front_totals": totals, "engine": engine, "workers": workers}

    # ---- bus loops --------------------------------------------------------------------------------------

    async def _receive_loop(self, pull: zmq.asyncio.Socket) -> None:
        """One awaited poll per wakeup, then every queued frame read without blocking: pyzmq's asyncio recv makes
        a Future per frame, which cost a quarter of the front's CPU at high frame rates."""
        reader = zmq.Socket.shadow(pull.underlying)
        while True:
            await pull.poll(flags=zmq.POLLIN)
            for _ in range(MAX_FRAMES_PER_WAKEUP):  # then let the HTTP side run before reading on
                try:
                    frame = reader.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    self._handle(frame.buffer)
                except Exception:  # a bad frame must never stop the front
                    self.counters["handler_errors"] += 1
                    if _repeated_faults.allow("handle") is not None:
                        errors = self.counters["handler_errors"]
                        log.exception("front: failed to handle a bus frame (%d so far)", errors)

    def _handle(self, frame: memoryview) -> None:
        message = self._decoder.decode(frame)
        if isinstance(message, TextBatch):
            if message.rids:
                self.metrics.bus_latency((time.time_ns() - message.sent_ns) / 1e9)
            self._on_text(message)
        elif isinstance(message, WorkerStats):
            self._workers[message.worker] = (message, time.monotonic())
        elif isinstance(message, EngineStats) and not self._engine_gone:
            self._engine = (message, time.monotonic())
            self.engine_refuses = tuple(message.refused_fields)
            if message.served_model_name:
                self.engine_model_name = message.served_model_name
            if message.max_model_len:
                self.engine_max_model_len = message.max_model_len
            if message.engine_version:
                self.engine_version = message.engine_version
            if message.system_fingerprint:
                self.system_fingerprint = message.system_fingerprint
            if message.vocab_size:
                self.engine_vocab_size = message.vocab_size
            self.engine_sampling_defaults = message.sampling_defaults
            if message.lora_adapters is not None:
                self._adapters_reported(message.lora_adapters)
        elif isinstance(message, AdapterAnswer):
            self._adapters_reported(message.lora_adapters)
            future = self._adapter_calls.get(message.call)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, PromptLogprobs):
            stream = self._prompt_waiting.get(message.rid)
            if stream is not None:
                stream.prompt_logprobs = message
                stream.wakeup.set()
        elif isinstance(message, PromptCached):
            stream = self._prompt_waiting.get(message.rid)
            if stream is not None:
                stream.cached_tokens = (message.cached_tokens, message.created_cache_tokens)
                stream.wakeup.set()
        elif isinstance(message, Reject):
            stream = self._streams.pop(message.rid, None)
            if stream is not None:
                self.counters["rejected"] += 1
                error, stream.refused = reject_error(message)
                stream.fail(error, drop_text=False)

    def _on_text(self, batch: TextBatch) -> None:
        """Every row of a TextBatch to its stream, in order: the plain ones (text only, most of them) read in place,
        a row with extras as a TextDelta. A stream with a sink writes its client's chunk from here (sse_direct)."""
        streams, budget, extras = self._streams, self.budget, batch.extras
        rids, offsets, texts, n_tokens = batch.rids, batch.offsets, batch.texts, batch.n_tokens
        chars = tokens = 0
        count = len(rids)
        for start, end in row_runs(0, count, extras):
            run = zip(rids[start:end], offsets[start:end], texts[start:end], n_tokens[start:end], strict=True)
            for rid, offset, text, n in run:
                stream = streams.get(rid)
                if stream is None:  # ended here already (aborted, failed) or not ours
                    self.counters["late_deltas"] += 1
                    continue
                before = stream.pending_chars
                try:
                    fresh = stream.accept_text(offset, text, n)
                except Exception as exc:  # noqa: BLE001 - a failure on one stream's output ends only that stream
                    self._output_failed(stream, exc)
                    continue
                if fresh is None or stream.done or len(fresh) != len(text):  # a gap, a failure, re-sent text
                    tokens += self._settle(stream, text, fresh, before)
                    continue
                chars += len(fresh)
                pending = stream.pending_chars
                if pending != before:  # buffered for its handler
                    budget.total += pending - before
                    if pending > budget.limit or budget.total > budget.budget:
                        self._check_slow(stream)
            if end == count:
                break
            stream = streams.get(rids[end])
            if stream is None:
                self.counters["late_deltas"] += 1
                continue
            delta = text_row(batch, end)
            before = stream.pending_chars
            try:
                fresh = stream.accept(delta)
            except Exception as exc:  # noqa: BLE001
                self._output_failed(stream, exc)
                continue
            tokens += self._settle(stream, delta.text, fresh, before)
        self.metrics.front_chars.inc(chars)  # held: written by flush_counters
        self.metrics.front_tokens.inc(tokens)

    def _output_failed(self, stream: RequestStream, exc: Exception) -> None:
        """Taking a delta into its stream raised (a bug of ours): that request ends with a 500 and the rest of the
        batch goes on, rather than every stream of the batch losing its rows."""
        self.counters["handler_errors"] += 1
        if _repeated_faults.allow("output") is not None:
            log.exception("front: failed on the output of %s (%d so far)", stream.rid, self.counters["handler_errors"])
        error = APIError(500, f"the server failed on this request's output: {exc}", type=SERVER_ERROR)
        self.abort(stream, error, drop_text=True, cause="front_error")

    def _settle(self, stream: RequestStream, text: str, fresh: str | None, before: int) -> int:
        """The bookkeeping after a delta other than the usual one (a gap, re-sent text, a row with extras, its
        stream's end); returns the tokens of a stream that ended (for the tokens metric)."""
        if fresh is None:
            self.counters["offset_gaps"] += 1
            self._outbox.post(encode(Abort(stream.rid)))
        else:
            self.metrics.front_chars.inc(len(fresh))
            self.budget.total += stream.pending_chars - before
            if len(fresh) != len(text):
                self.counters["duplicate_chars_dropped"] += len(text) - len(fresh)
        if stream.done:
            del self._streams[stream.rid]
            if stream.pending_chars:
                self.budget.unread[stream.rid] = stream
            self._outbox.post(encode(Delivered(stream.rid)))  # the engine may now forget the rid
            self.counters["failed" if stream.failure else "completed"] += 1
            return stream.n_tokens
        self._check_slow(stream)
        return 0

    def _check_slow(self, stream: RequestStream) -> None:
        error = self.budget.too_slow(stream)
        if error is not None:
            self.abort(stream, error, drop_text=True, cause="client_too_slow")

    def flush_counters(self) -> None:
        """Write what FrontMetrics holds to Prometheus (the sweep, each /metrics scrape, close)."""
        self.metrics.flush()

    async def _engine_watch_loop(self, monitor: zmq.asyncio.Socket) -> None:
        """The connection to the engine closes when its process ends (ipc, or tcp to a live host): act at once, but
        for ENGINE_GONE_GRACE_S, in which the frames it sent before it went reach the intake (they come on other
        connections, in no fixed order with this event): a request the engine failed ends with its reason."""
        loop = asyncio.get_running_loop()
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
            if event == zmq.EVENT_CONNECTED:  # an engine (the same or a new one) took the connection
                self._engine_gone = False
            elif event == zmq.EVENT_DISCONNECTED:
                self._engine_gone = True
                if self._engine is not None:
                    self._engine = None  # not alive (/health, new requests) until a (new) engine reports again
                    # the requests it had: a new engine that reports within the grace takes new ones, which stay
                    had = list(self._streams.values())
                    loop.call_later(ENGINE_GONE_GRACE_S, self._fail_engine_requests, "its connection closed", had)

    async def _sweep_loop(self) -> None:
        woke = time.monotonic()
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            # A front that was not running (SIGSTOP, starved of CPU) has not read the stats the engine sent
            # meanwhile: judge the engine only after a sweep that came on time, once the intake has caught up.
            now = time.monotonic()
            late = now - woke > SWEEP_INTERVAL_S + 1.0
            woke = now
            if not late and self._engine_stale():
                self._engine_lost(f"no stats for {ENGINE_STALE_S:.0f} s")
            self.metrics.sync(live_rids=self.live_rids, bad_frames=self._decoder.bad_frames)
            self.flush_counters()
            section = self.front_section()  # recounts the pending text exactly
            if self._shared_dir is not None:
                try:
                    write_snapshot(self._shared_dir, self.index, section)
                except OSError as exc:
                    warn_rate_limited(log, _repeated_faults, "stats", "cannot share /stats with the fronts: %s", exc)
            # worker ids come and go (HOSTNAME-PID after each restart): forget the silent ones, or the table grows
            for worker in [w for w, (_, seen) in self._workers.items() if now - seen >= self._worker_stale_s]:
                del self._workers[worker]
            expired = [stream for stream in self._streams.values() if stream.deadline <= now]
            for stream in expired:
                self.counters["timed_out"] += 1
                message = f"the request did not finish within {self.config.front.request_timeout_s} s"
                self.abort(stream, APIError(504, message, type=TIMEOUT, code="timeout"), cause="timeout")
