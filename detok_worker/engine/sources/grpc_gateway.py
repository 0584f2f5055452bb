"""`detok engine --source grpc`: detok as the gateway in front of an engine that serves the token-only gRPC API
(vLLM `--grpc`, SGLang `--grpc-mode`; the tests' `detok engine-server`).

A relay, not a second scheduler: every Submit opens a streaming Generate on the engine at once
(grpc_dialects.Dialect.generate_request) and the engine schedules it (no admission cap of ours: engine.max_batch is the
stub's). One asyncio loop: the ids of each chunk are pushed into the EngineLink as they arrive and mark a turn due;
the turn runs once per pass of the event loop, after every stream that had a chunk in that pass, and sends one
TokenBatch per worker with all of it (no tick: an id waits for nothing but the loop's own pass). The bus sockets
wake the loop too (their ZMQ_FD under loop.add_reader), so Submits, Aborts and worker messages are taken at once;
a timer runs the link's timers (worker liveness, stats) while nothing else happens. A rid a worker stopped (stop
string) or the client left is aborted on the engine (the stream is cancelled and Abort is sent). A stream that
fails before its first response (CANCELLED, UNAVAILABLE) is opened again, up to engine.start_retries times. An
engine failure mid-stream ends each open request with an error naming the engine (the client gets it at once); new
requests fail the same way until the engine is back, then work again (the channel reconnects by itself).
Backpressure: while a rid's ids wait in the link (its worker's queue is full) its stream is not read, so gRPC's
flow control holds the engine back; a client that does not read is the front's to bound (front.max_pending_chars).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from functools import partial
from typing import Any

import grpc

from detok_worker.bus.messages import Submit
from detok_worker.config import DetokConfig
from detok_worker.engine.grpc_api import (
    FINISH_REASONS,
    EngineApi,
    connect_engine,
    engine_failure,
    new_ids_of_complete,
    output_logprobs,
)
from detok_worker.engine.link import BLOCKED_RETRY_S, EngineLink
from detok_worker.engine.sources.base import RunOptions
from detok_worker.process.runtime import run_event_loop, stop_on_signals
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer

log = logging.getLogger(__name__)

MIN_TIMER_S = 0.001  # the link's timers are due: their turn comes this soon at the earliest
BACKLOG_LIMIT = 256  # ids of a rid waiting for its worker before its stream is read again
ABORT_TIMEOUT_S = 5.0
RETRY_BACKOFF_S = 0.05  # before the first retry of a Generate; doubled for each next one
# a Generate that ends with one of these before any response is opened again (engine.start_retries)
RETRIED_CODES = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)


def gateway_link(config: DetokConfig, tokenizer: Tokenizer, api: EngineApi) -> EngineLink:
    """The gateway's bus side: Opens carry the engine's vocabulary size, the fronts serve its model name."""
    return EngineLink(
        config,
        tokenizer,
        vocab_size=api.vocab_size,
        served_model_name=api.served_model_name,
        max_model_len=api.max_context_length,
    )


class GrpcGateway:
    """The relay between `link` (closed when run ends) and the engine behind `api`; start_retries: how many times a
    Generate that fails before its first response is opened (engine.start_retries)."""

    def __init__(self, link: EngineLink, api: EngineApi, start_retries: int) -> None:
        self.api = api
        self.link = link
        self.max_starts = start_retries
        self.due = asyncio.Event()  # a turn is due: ids or bus frames arrived, or a timer fired
        self.sent = asyncio.Event()  # set (and replaced) by each turn that sent ids while streams wait on a backlog
        self.backlogged = 0  # streams waiting for their rid's ids to reach its worker
        self.retry: asyncio.TimerHandle | None = None  # a turn due after a step found a worker's queue full
        self.streams: dict[str, asyncio.Task[None]] = {}
        self.background: set[asyncio.Task[Any]] = set()
        self.stopping = False

    def request_stop(self) -> None:
        self.stopping = True

    async def run(self) -> None:
        endpoints = self.link.sockets.endpoints
        log.info(
            "engine: gateway to %s; submits at %s, workers at %s", self.api.url, endpoints.engine, endpoints.workers
        )
        link = self.link
        loop = asyncio.get_running_loop()
        fds = link.fds()
        for fd in fds:
            loop.add_reader(fd, self.due.set)
        timer = asyncio.create_task(self._timer())
        try:
            while not self.stopping:
                await self.due.wait()
                self.due.clear()
                self._turn()
        finally:
            timer.cancel()
            if self.retry is not None:
                self.retry.cancel()
            for fd in fds:
                loop.remove_reader(fd)
            for task in list(self.streams.values()):
                task.cancel()
            await asyncio.gather(timer, *self.streams.values(), *self.background, return_exceptions=True)
            link.close()
            await self.api.channel.close()

    async def _timer(self) -> None:
        """A turn when the link's timers are due (worker liveness, stats, the fronts' outbox), however quiet the bus."""
        while True:
            await asyncio.sleep(max(MIN_TIMER_S, self.link.idle_wait_s()))
            self.due.set()

    def _turn(self) -> None:
        """Everything that arrived since the last turn: the bus's news, then one step with every stream's new ids."""
        link = self.link
        news = link.poll(0.0)
        for rid in news.stopped:  # before the submits: a stopped rid submitted again is a new request
            self._stop(rid)
        for submit in news.submitted:
            self._start(submit)
        if link.scheduler.has_work():
            if link.step() and self.backlogged:
                sent, self.sent = self.sent, asyncio.Event()
                sent.set()
            if link.blocked and self.retry is None:
                self.retry = asyncio.get_running_loop().call_later(BLOCKED_RETRY_S, self._retry_step)
        if link.has_news():  # the sockets' FDs are edge-triggered: what one poll left is not signalled again
            self.due.set()

    def _start(self, submit: Submit) -> None:
        api = self.api
        build = partial(api.dialect.generate_request, submit.rid, submit.prompt_ids, submit.params)
        if (accepted := self.link.accept_relayed(submit, build, f"{api.dialect.service} at {api.url}")) is not None:
            self.streams[submit.rid] = asyncio.create_task(self._generate(submit.rid, accepted[1]))

    def _stop(self, rid: str) -> None:
        """A worker found a stop string, or the client went away: stop generating on the engine."""
        task = self.streams.pop(rid, None)
        if task is None:
            return
        abort = asyncio.create_task(self._abort_on_engine(rid, task))
        self.background.add(abort)
        abort.add_done_callback(self.background.discard)

    async def _abort_on_engine(self, rid: str, stream: asyncio.Task[None]) -> None:
        """Abort first (the engine frees the request at once), then drop the stream (no more ids are pushed
        for the rid meanwhile: the link refuses them)."""
        api = self.api
        try:
            await api.stub.Abort(api.dialect.abort_request(rid), timeout=ABORT_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:  # the cancelled stream tells the engine too
            log.debug("engine: Abort(%s) on %s failed: %s", rid, api.url, exc.code().name)
        finally:
            stream.cancel()

    async def _generate(self, rid: str, request: Any) -> None:
        """Stream the rid's ids from the engine into the link. A stream the engine ends with a retried code before
        any response (nothing of it reached the link, let alone the client) is opened again, up to
        engine.start_retries times: grpcio's aio server cancels a few of ~1500 concurrent streams as they start."""
        try:
            for attempt in range(self.max_starts):
                code = await self._stream(rid, request)
                if code is None:
                    return
                log.info(
                    "engine: Generate(%s) on %s ended %s before any output; retry %d",
                    rid,
                    self.api.url,
                    code.name,
                    attempt + 1,
                )
                await asyncio.sleep(RETRY_BACKOFF_S * 2**attempt)
            await self._stream(rid, request, last=True)
        finally:
            if self.streams.get(rid) is asyncio.current_task():
                del self.streams[rid]
            self.due.set()  # a failure's end item for the worker goes out with the next step

    def _retry_step(self) -> None:
        self.retry = None
        self.due.set()

    async def _wait_sent(self) -> None:
        """Until a turn sends ids to the workers (the rid's may be among them)."""
        self.backlogged += 1
        try:
            await self.sent.wait()
        finally:
            self.backlogged -= 1

    async def _stream(self, rid: str, request: Any, last: bool = False) -> grpc.StatusCode | None:
        """One Generate stream of the rid. Returns the status code of a failure worth a retry (unless `last`);
        None when the rid is done with (ended, failed, or stopped by us)."""
        link = self.link
        api = self.api
        received = 0
        responded = False
        call = api.stub.Generate(request)
        try:
            async for response in call:
                responded = True
                kind = response.WhichOneof("response")
                if kind == "chunk":
                    ids = list(response.chunk.token_ids)
                    received += len(ids)
                    if not link.push(rid, ids, None, output_logprobs(response.chunk)):
                        return None
                    self.due.set()
                    while link.backlog(rid) > BACKLOG_LIMIT:
                        await self._wait_sent()
                elif kind == "complete":
                    complete = response.complete
                    finish = FINISH_REASONS.get(complete.finish_reason)
                    if finish is None:
                        link.fail(rid, f"the gRPC engine at {api.url} ended the request: {complete.finish_reason}")
                    else:
                        new_ids = new_ids_of_complete(list(complete.output_ids), received)
                        link.push(rid, new_ids, finish, output_logprobs(complete, received) if new_ids else None)
                        self.due.set()
                    return None
            link.fail(rid, f"the gRPC engine at {api.url} ended the stream without GenerateComplete")
        except grpc.aio.AioRpcError as exc:
            stopped = self.streams.get(rid) is not asyncio.current_task()  # _stop took the stream: its CANCELLED
            if stopped and exc.code() == grpc.StatusCode.CANCELLED:
                return None
            if not stopped and not responded and not last and exc.code() in RETRIED_CODES:
                return exc.code()
            link.fail(rid, engine_failure(api.url, exc))
        finally:
            call.cancel()
        return None


def run_gateway(config: DetokConfig, options: RunOptions) -> int:
    """Connect to engine.engine_url, check it, and serve the bus until SIGINT/SIGTERM."""
    engine = config.engine
    tokenizer = load_configured_tokenizer(config)

    async def main() -> None:
        started = time.monotonic()
        api = await connect_engine(engine.engine_url, engine.engine_service, tokenizer, engine.connect_timeout_s)
        log.info("engine: connected to %s in %.2f s", engine.engine_url, time.monotonic() - started)
        gateway = GrpcGateway(gateway_link(config, tokenizer, api), api, engine.start_retries)
        with stop_on_signals(gateway.request_stop):
            await gateway.run()

    with contextlib.suppress(KeyboardInterrupt):
        run_event_loop(main())
    return 0
