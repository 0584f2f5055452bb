"""The Starlette app: OpenAI-compatible endpoints over the Dispatcher.

POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models[/{id}], POST /tokenize and
/detokenize, GET /version, GET /health (never needs the API key: supervisors and load balancers poll it),
GET /stats. X-Request-Id and CORS: middleware.py. Every failure a client can cause is a 4xx with an
OpenAI error body; see errors.py for the shape and sse.py for errors after a stream has started.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.metadata
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from detok_worker.bus.messages import LogprobText, RequestParams
from detok_worker.config import DetokConfig
from detok_worker.front import sse
from detok_worker.front.api_key import resolve_api_key
from detok_worker.front.choices import Choices, choice_params, choice_rids, finished_streams
from detok_worker.front.dispatch import SHUTTING_DOWN, Dispatcher
from detok_worker.front.errors import AUTHENTICATION, NOT_FOUND, SERVER_ERROR, APIError, encode_error
from detok_worker.front.middleware import middleware_for, request_rid
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from detok_worker.front.openapi import openapi_document
from detok_worker.front.parsing import ParserChoice
from detok_worker.front.prompts import chat_prompt_ids, completion_prompt_ids, echo_text, prompt_chars
from detok_worker.front.responses import ChatFormatter, ChunkUsage, CompletionFormatter, Formatter
from detok_worker.front.tokenize_api import decode_detokenize, decode_tokenize, detokenize, tokenize
from detok_worker.front.validation import (
    CheckedParams,
    Limits,
    check_generation,
    check_model,
    decode_chat,
    decode_completion,
    truncate_prompt,
)
from detok_worker.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from detok_worker.metrics import InstrumentedTokenizer, render_latest
from detok_worker.parse.base import ParsedOutput
from detok_worker.tokenizer.encode_cache import wrap_with_encode_cache
from detok_worker.tokenizer.protocol import Tokenizer

log = logging.getLogger(__name__)

JSON = "application/json"
PROMPT_THREADS = 2  # chat templates and tokenizing of longer prompts run off the event loop
# A prompt this short is rendered and tokenized on the loop: the hand-off to a thread costs more CPU (~100+ us)
# than the work (~40 us for a 40-character completion prompt; BENCHMARKS.md, "Front per chunk").
INLINE_PROMPT_CHARS = 512
RETRY_AFTER_S = 5  # what a request refused while draining is told
DRAIN_POLL_S = 0.05
DRAIN_FLUSH_S = 2.0  # after the drain timeout: time for the failed streams to send their error event
T = TypeVar("T")
R = TypeVar("R", CompletionRequest, ChatCompletionRequest)


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status_code=status, media_type=JSON)


def error_response(error: APIError, headers: dict[str, str] | None = None) -> Response:
    if error.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return Response(encode_error(error), status_code=error.status, media_type=JSON, headers=headers)


class Front:
    """Request handlers and the state they share."""

    def __init__(self, config: DetokConfig, tokenizer: Tokenizer, index: int = 0) -> None:
        self.config = config
        # every prompt goes through the encode cache when [tokenizer.cache] enables it; calls are timed for /metrics
        self.tokenizer = InstrumentedTokenizer(wrap_with_encode_cache(tokenizer, config.tokenizer.cache))
        self.model_name = config.front.model_name or tokenizer.name
        self.limits = Limits.from_config(config, self.model_name, tokenizer)
        self.max_model_len = config.front.max_model_len or getattr(tokenizer, "model_max_length", None)
        self.dispatcher = Dispatcher(config, index)
        self.parsers = ParserChoice.from_config(config, tokenizer)
        self._api_key = resolve_api_key(config.front).encode("utf-8")
        self._executor = ThreadPoolExecutor(PROMPT_THREADS, thread_name_prefix="front-prompt")
        self.draining = False  # set on SIGTERM (server.py): new requests get 503, live ones may finish
        self._open_event_streams = 0

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.dispatcher.start()
        try:
            yield
        finally:
            await self.dispatcher.close()
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def drain(self) -> None:
        """Stop taking requests, let live ones finish for up to front.drain_timeout_s, then end the rest with an
        error (an SSE error event and [DONE]) and give their handlers a moment to send it."""
        self.draining = True
        self.dispatcher.metrics.draining.set(1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.front.drain_timeout_s
        log.info(
            "draining: %d live requests, up to %.1f s", self.dispatcher.live_rids, self.config.front.drain_timeout_s
        )
        while self.dispatcher.live_rids and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        failed = self.dispatcher.fail_all(SHUTTING_DOWN, cause="shutdown")
        if failed:
            log.warning("drain timeout: %d requests ended with a shutdown error", failed)
        deadline = loop.time() + DRAIN_FLUSH_S
        while self._open_event_streams and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)

    # ---- plumbing ---------------------------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if not self._api_key:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"), self._api_key):
            raise APIError(401, "invalid or missing API key", type=AUTHENTICATION, code="invalid_api_key")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.config.front.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
        except ClientDisconnect as exc:  # nobody is left to read the answer; no need to log an error
            raise APIError(400, "the client disconnected while sending the request", code="disconnected") from exc
        return b"".join(chunks)

    async def _off_loop(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    # ---- endpoints --------------------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        def prompt_ids(body: CompletionRequest) -> list[int]:
            return completion_prompt_ids(body, self.tokenizer, self.limits)

        return await self._generate(request, decode_completion, prompt_ids, CompletionFormatter, "cmpl")

    async def chat_completions(self, request: Request) -> Response:
        def prompt_ids(body: ChatCompletionRequest) -> list[int]:
            return chat_prompt_ids(body, self.tokenizer, self.limits)

        return await self._generate(request, decode_chat, prompt_ids, ChatFormatter, "chatcmpl")

    async def _generate(
        self,
        request: Request,
        decode: Callable[[bytes], R],
        prompt_ids: Callable[[R], list[int]],
        formatter_type: type[CompletionFormatter] | type[ChatFormatter],
        id_kind: str,
    ) -> Response:
        if self.draining:
            return error_response(SHUTTING_DOWN, {"Retry-After": str(RETRY_AFTER_S)})
        self._authorize(request)
        body = decode(await self._read_body(request))
        model = check_model(body.model, self.limits)
        checked = check_generation(body, self.limits)
        params = (
            self.parsers.for_chat(body, checked.params) if isinstance(body, ChatCompletionRequest) else checked.params
        )
        size = prompt_chars(body)
        if size is not None and size <= INLINE_PROMPT_CHARS:
            ids = truncate_prompt(prompt_ids(body), body)
        else:  # chat template + tokenizing of a long prompt: off the loop
            ids = truncate_prompt(await self._off_loop(prompt_ids, body), body)
        echo = None
        if checked.echo and isinstance(body, CompletionRequest):
            echo = await self._off_loop(echo_text, body, ids, self.tokenizer)
        rid = request_rid(request, id_kind, body.request_id)
        choices = self._submit(ids, params, checked, rid)
        request.state.stream = choices  # for the access log and the TTFT / latency metrics (request_log.py)
        self.dispatcher.metrics.request(request.scope["path"])  # a generation route (request.url: a URL object)
        usage = ChunkUsage(checked.include_usage, checked.continuous_usage)
        formatter = formatter_type(rid, model, usage, echo, params.sampling.logprobs is not None)
        if body.stream:
            events = self._events(choices, formatter, checked.include_usage)
            return sse.EventStreamResponse(events, on_close=lambda: self._release(choices))
        return await self._collect(request, choices, formatter)

    def _submit(self, ids: list[int], params: RequestParams, checked: CheckedParams, rid: str) -> Choices:
        """One engine request per choice (none for echo with max_tokens 0: the answer is the prompt)."""
        rids = choice_rids(rid, checked.n)
        if params.max_tokens == 0:
            return Choices(rid, finished_streams(rids, len(ids), checked.stop_rules))
        requests = list(zip(rids, choice_params(params, checked.n), strict=True))
        return Choices(rid, self.dispatcher.submit_choices(ids, requests, checked.stop_rules, asyncio.Event()))

    def _model_card(self) -> ModelCard:
        return ModelCard(self.model_name, created=0, root=self.model_name, max_model_len=self.max_model_len)

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return json_response(ModelList([self._model_card()]))

    async def model(self, request: Request) -> Response:
        self._authorize(request)
        check_model(request.path_params["model"], self.limits)
        return json_response(self._model_card())

    async def tokenize(self, request: Request) -> Response:
        self._authorize(request)
        body = decode_tokenize(await self._read_body(request))
        check_model(body.model, self.limits)
        return json_response(await self._off_loop(tokenize, body, self.tokenizer, self.limits, self.max_model_len))

    async def detokenize(self, request: Request) -> Response:
        self._authorize(request)
        body = decode_detokenize(await self._read_body(request))
        check_model(body.model, self.limits)
        return json_response(await self._off_loop(detokenize, body, self.tokenizer, self.limits))

    async def version(self, request: Request) -> Response:
        return json_response({"version": detok_version()})

    async def health(self, request: Request) -> Response:
        healthy = self.dispatcher.healthy() and not self.draining
        stats = self.dispatcher.stats()
        payload = {
            "status": "draining" if self.draining else "ok" if healthy else "unavailable",
            "engine": stats["engine"] is not None and self.dispatcher.engine_alive(),
            "workers": len(stats["engine"]["workers"]) if stats["engine"] else 0,
            "live_rids": self.dispatcher.live_rids,
        }
        return json_response(payload, 200 if healthy else 503)

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_document(f"detok ({self.model_name})"))

    async def stats(self, request: Request) -> Response:
        self._authorize(request)
        stats = self.dispatcher.stats()
        cache_stats = getattr(self.tokenizer, "stats", None)
        if callable(cache_stats):
            stats["front"]["encode_cache"] = cache_stats().as_dict()
        return json_response(stats)

    async def metrics(self, request: Request) -> Response:
        """Prometheus text format; like /health it needs no API key (scrapers rarely carry one)."""
        self.dispatcher.flush_counters()
        return Response(await self._off_loop(render_latest), media_type=METRICS_CONTENT_TYPE)

    # ---- generation responses ---------------------------------------------------------------------------

    def _release(self, choices: Choices) -> None:
        for stream in choices.streams:
            if not stream.done:  # the client went away, the server is stopping, or another choice failed
                self.dispatcher.abort(stream)
            self.dispatcher.release(stream)

    async def _events(self, choices: Choices, formatter: Formatter, include_usage: bool) -> AsyncIterator[bytes]:
        clients = self.dispatcher.metrics.sse_clients
        clients.inc()
        self._open_event_streams += 1
        try:
            for index, stream in enumerate(choices.streams):
                first = formatter.first_chunk(index, stream)
                if first is not None:
                    yield sse.event(first)
            while True:  # after the end (or a failure) one more round: the text that came with it
                ready: list[bytes] = []  # the events of one round go out in one write
                for index, news, ended in await choices.changes():
                    stream = choices.streams[index]
                    logprobs = stream.take_logprobs()
                    if news or logprobs:
                        ready.append(sse.event(formatter.text_chunk(index, news, stream, logprobs)))
                    if ended and stream.failure is None:
                        ready.append(sse.event(formatter.final_chunk(index, stream)))
                if choices.finished:
                    break
                if ready:
                    yield ready[0] if len(ready) == 1 else b"".join(ready)
            failure = choices.failure
            if failure is not None:
                self._release(choices)  # one choice failed: the whole request ends with its error (as vLLM)
                ready.append(sse.error_event(failure))
            elif include_usage:
                ready.append(sse.event(formatter.usage_chunk(choices)))
            yield b"".join([*ready, sse.DONE])
        finally:
            clients.dec()
            self._open_event_streams -= 1

    async def _collect(self, request: Request, choices: Choices, formatter: Formatter) -> Response:
        watcher = asyncio.create_task(self._abort_on_disconnect(request, choices))
        pieces: list[list[str | ParsedOutput]] = [[] for _ in choices.streams]
        logprobs: list[list[LogprobText]] = [[] for _ in choices.streams]
        try:
            while True:
                for index, news, _ in await choices.changes():
                    pieces[index].append(news)
                    logprobs[index] += choices.streams[index].take_logprobs()
                if choices.finished:
                    break
        finally:
            watcher.cancel()
            self._release(choices)
        if choices.failure is not None:
            return error_response(choices.failure)
        return Response(formatter.whole(pieces, choices, logprobs), media_type=JSON)

    async def _abort_on_disconnect(self, request: Request, choices: Choices) -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                error = APIError(499, "the client closed the connection", code="disconnected")
                for stream in choices.streams:
                    self.dispatcher.abort(stream, error)
                return


def detok_version() -> str:
    try:
        return importlib.metadata.version("detok")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


async def _api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _http_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = NOT_FOUND if exc.status_code == 404 else "invalid_request_error"
    return error_response(APIError(exc.status_code, str(exc.detail), type=kind), exc.headers)  # 405: Allow


async def _unexpected_error_handler(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(APIError(500, "internal server error", type=SERVER_ERROR))


class FrontApp(Starlette):
    """Starlette that also puts the server's own `send` in the scope, for the body of an SSE response
    (sse.EventStreamResponse)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[sse.SERVER_SEND] = send
        await super().__call__(scope, receive, send)


def create_app(config: DetokConfig, tokenizer: Tokenizer, index: int = 0) -> Starlette:
    """The front as an ASGI app; the bus sockets open in its lifespan (so run it with lifespan on). `index`: which
    of the front.processes front processes this is (its bus PULL, the Submit.front of its requests)."""
    front = Front(config, tokenizer, index)
    routes = [
        Route("/v1/completions", front.completions, methods=["POST"]),
        Route("/v1/chat/completions", front.chat_completions, methods=["POST"]),
        Route("/v1/models", front.models, methods=["GET"]),
        Route("/v1/models/{model:path}", front.model, methods=["GET"]),
        Route("/tokenize", front.tokenize, methods=["POST"]),
        Route("/detokenize", front.detokenize, methods=["POST"]),
        Route("/version", front.version, methods=["GET"]),
        Route("/health", front.health, methods=["GET"]),
        Route("/stats", front.stats, methods=["GET"]),
        Route("/metrics", front.metrics, methods=["GET"]),
        Route("/openapi.json", front.openapi, methods=["GET"]),
    ]
    app = FrontApp(
        routes=routes,
        middleware=middleware_for(config, front.dispatcher.metrics),
        lifespan=front.lifespan,
        exception_handlers={
            APIError: _api_error_handler,
            HTTPException: _http_error_handler,
            Exception: _unexpected_error_handler,
        },
    )
    app.state.front = front
    return app
