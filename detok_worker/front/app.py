"""The Starlette app: OpenAI-compatible endpoints over the Dispatcher.

POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models[/{id}], POST /tokenize and
/detokenize, GET /version, GET /health (never needs the API key: supervisors and load balancers poll it),
GET /stats, and with front.runtime_lora_updating POST /v1/load_lora_adapter and /v1/unload_lora_adapter
(lora_api.py). X-Request-Id and CORS: edge.py. Every failure a client can cause is a 4xx with an
OpenAI error body; see errors.py for the shape and sse.py for errors after a stream has started. The generation
routes: generation.py; the API key check, body reading and prompt threads every route shares: request_intake.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from detok_worker.config import DetokConfig
from detok_worker.front import sse
from detok_worker.front.dispatch import SHUTTING_DOWN, Dispatcher
from detok_worker.front.edge import DirectRoutes, RequestObserver, middleware_for
from detok_worker.front.errors import JSON, NOT_FOUND, SERVER_ERROR, APIError, error_response
from detok_worker.front.generation import INLINE_PROMPT_CHARS as INLINE_PROMPT_CHARS  # tests import it from here
from detok_worker.front.generation import Generation
from detok_worker.front.lora_api import LoraAdapterRoutes
from detok_worker.front.openai_api import ModelCard, ModelList, ModelPermission
from detok_worker.front.openapi import openapi_document
from detok_worker.front.parsing import ParserChoice
from detok_worker.front.request_intake import RequestIntake
from detok_worker.front.tokenize_api import decode_detokenize, decode_tokenize, detokenize, tokenize
from detok_worker.front.validation import Limits, check_model, served_model_name
from detok_worker.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from detok_worker.metrics import InstrumentedTokenizer, render_latest
from detok_worker.tokenizer.encode_cache import CachedTokenizer, wrap_with_encode_cache
from detok_worker.tokenizer.protocol import Tokenizer

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.05
DRAIN_FLUSH_S = 2.0  # after the drain timeout: time for the failed streams to send their error event


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status_code=status, media_type=JSON)


class Front:
    """Request handlers and the state they share."""

    def __init__(self, config: DetokConfig, tokenizer: Tokenizer, index: int = 0) -> None:
        self.config = config
        # every prompt goes through the encode cache when [tokenizer.cache] enables it; calls are timed for /metrics
        self.encode_cache = wrap_with_encode_cache(tokenizer, config.tokenizer.cache)
        self.tokenizer = InstrumentedTokenizer(self.encode_cache)
        self.dispatcher = Dispatcher(config, index)
        model_name = config.front.model_name or tokenizer.name
        self.limits = Limits.from_config(config, model_name, tokenizer, self.dispatcher.lora_adapters)
        self._tokenizer_max_len: int | None = getattr(tokenizer, "model_max_length", None)
        self.dispatcher.metrics.also_flush(self.tokenizer)
        self.parsers = ParserChoice.from_config(config, tokenizer)
        self.intake = RequestIntake(config.front)
        self.observer: RequestObserver | None = None  # create_app's, which counts the load
        self.generation = Generation(
            self.tokenizer, self.limits, self.parsers, self.dispatcher, self.intake, lambda: self.max_model_len
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.dispatcher.start()
        try:
            yield
        finally:
            await self.dispatcher.close()
            self.intake.close()

    async def drain(self) -> None:
        """Stop taking requests, let live ones finish for up to front.drain_timeout_s, then end the rest with an
        error (an SSE error event and [DONE]) and give their handlers a moment to send it. Called on SIGTERM
        (server.py)."""
        self.generation.draining = True
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
        while self.generation.open_event_streams and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)

    # ---- endpoints (generation: generation.py) ------------------------------------------------------------

    @property
    def model_name(self) -> str:
        """The name served (validation.served_model_name): front.model_name, the engine's, or the tokenizer's."""
        return served_model_name(self.limits, self.dispatcher.engine_model_name)

    @property
    def max_model_len(self) -> int | None:
        """front.max_model_len when set, else the engine's context length (once reported), else the tokenizer's."""
        configured = self.config.front.max_model_len
        return configured or self.dispatcher.engine_max_model_len or self._tokenizer_max_len

    def _card(self, name: str, root: str, parent: str | None = None, max_model_len: int | None = None) -> ModelCard:
        """detok's card, or on `--source vllm` vLLM's (its models/serving.py): owned by "vllm", made now, with one
        ModelPermission of vLLM's defaults."""
        if not self.limits.vllm_server:
            return ModelCard(id=name, root=root, parent=parent, max_model_len=max_model_len)
        return ModelCard(
            id=name,
            created=int(time.time()),
            owned_by="vllm",
            root=root,
            parent=parent,
            max_model_len=max_model_len,
            permission=[ModelPermission()],
        )

    def _model_card(self, name: str) -> ModelCard:
        """A served name's card. vLLM's root is the model it loaded (`--model`, for every served name); detok's
        elsewhere is the served name."""
        root = self.config.engine.model if self.limits.vllm_server else self.model_name
        return self._card(name, root, max_model_len=self.max_model_len)

    def _adapter_card(self, name: str) -> ModelCard:
        """A LoRA adapter's card, as vLLM writes it: its path as root, the base model as parent."""
        return self._card(name, self.limits.lora_adapters[name], parent=self.model_name)

    async def models(self, request: Request) -> Response:
        self.intake.authorize(request)
        names = [self.model_name, *self.limits.model_aliases]
        cards = [self._model_card(name) for name in names] + [self._adapter_card(n) for n in self.limits.lora_adapters]
        return json_response(ModelList(cards))

    async def model(self, request: Request) -> Response:
        self.intake.authorize(request)
        name = request.path_params["model"]
        check_model(name, self.limits, self.dispatcher.engine_model_name)
        card = self._adapter_card(name) if name in self.limits.lora_adapters else self._model_card(name)
        return json_response(card)

    async def tokenize(self, request: Request) -> Response:
        self.intake.authorize(request)
        body = decode_tokenize(await self.intake.read_body(request))
        check_model(body.model, self.limits, self.dispatcher.engine_model_name)
        return json_response(
            await self.intake.off_loop(tokenize, body, self.tokenizer, self.limits, self.max_model_len)
        )

    async def detokenize(self, request: Request) -> Response:
        self.intake.authorize(request)
        body = decode_detokenize(await self.intake.read_body(request))
        check_model(body.model, self.limits, self.dispatcher.engine_model_name)
        return json_response(await self.intake.off_loop(detokenize, body, self.tokenizer, self.limits))

    async def version(self, request: Request) -> Response:
        """vLLM's shape: {"version"} is the engine's (vLLM's) where the engine reports one, else detok's."""
        engine = self.dispatcher.engine_version
        return json_response({"version": engine or detok_version(), "detok_version": detok_version()})

    async def ping(self, request: Request) -> Response:
        """SageMaker's health check (vLLM's /ping): /health's status, no body."""
        return Response(status_code=200 if self._healthy() else 503)

    def _healthy(self) -> bool:
        """An engine with a worker reports to this front, and it is not draining."""
        return self.dispatcher.healthy() and not self.generation.draining

    async def load(self, request: Request) -> Response:
        """vLLM's /load: the generation requests in flight in this front (front.server_load; else 0)."""
        return json_response({"server_load": self.observer.load if self.observer is not None else 0})

    async def invocations(self, request: Request) -> Response:
        """SageMaker's inference route (vLLM's /invocations): a chat completion when the body has messages, else
        a completion. The same API key as /v1, checked before the body is read (the route checks it again)."""
        self.intake.authorize(request)
        body = await self.intake.read_body(request)
        try:
            chat = "messages" in msgspec.json.decode(body)
        except (msgspec.DecodeError, TypeError):
            chat = False  # the completions route answers the bad body with its 400
        request.state.body = body  # read_body gives it again
        return await (self.generation.chat_completions if chat else self.generation.completions)(request)

    async def health(self, request: Request) -> Response:
        healthy = self._healthy()
        stats = self.dispatcher.stats()
        payload = {
            "status": "draining" if self.generation.draining else "ok" if healthy else "unavailable",
            "engine": stats["engine"] is not None and self.dispatcher.engine_alive(),
            "workers": len(stats["engine"]["workers"]) if stats["engine"] else 0,
            "live_rids": self.dispatcher.live_rids,
        }
        return json_response(payload, 200 if healthy else 503)

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_document(f"detok ({self.model_name})"))

    async def stats(self, request: Request) -> Response:
        self.intake.authorize(request)
        stats = self.dispatcher.stats()
        if isinstance(self.encode_cache, CachedTokenizer):
            stats["front"]["encode_cache"] = self.encode_cache.stats().as_dict()
        return json_response(stats)

    async def metrics(self, request: Request) -> Response:
        """Prometheus text format; like /health it needs no API key (scrapers rarely carry one)."""
        self.dispatcher.flush_counters()
        return Response(await self.intake.off_loop(render_latest), media_type=METRICS_CONTENT_TYPE)


# the generation routes whose requests in flight are the server's load (vLLM counts its generation routes)
LOAD_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses", "/invocations"})


def detok_version() -> str:
    try:
        return importlib.metadata.version("detok")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
    (sse.EventStreamResponse), and serves the generation routes past its stack when `direct` has them. With a
    `root_path` (front.root_path) each request's scope has it, as FastAPI's root_path does for vLLM's server: a
    route answers with the prefix (the router strips it) and without it (a proxy stripped it)."""

    direct: DirectRoutes | None = None
    root_path: str = ""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[sse.SERVER_SEND] = send
        if self.root_path:
            scope["root_path"] = self.root_path
        route = self.direct.match(scope) if self.direct is not None else None
        if route is None:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        await self.direct.serve(route, scope, receive, send)  # type: ignore[union-attr]


def create_app(config: DetokConfig, tokenizer: Tokenizer, index: int = 0) -> Starlette:
    """The front as an ASGI app; the bus sockets open in its lifespan (so run it with lifespan on). `index`: which
    of the front.processes front processes this is (its bus PULL, the Submit.front of its requests)."""
    front = Front(config, tokenizer, index)
    generation_routes = [
        Route("/v1/completions", front.generation.completions, methods=["POST"]),
        Route("/v1/chat/completions", front.generation.chat_completions, methods=["POST"]),
        Route("/v1/messages", front.generation.messages, methods=["POST"]),
        Route("/v1/responses", front.generation.responses, methods=["POST"]),
    ]
    routes = [
        *generation_routes,
        Route("/v1/models", front.models, methods=["GET"]),
        Route("/v1/models/{model:path}", front.model, methods=["GET"]),
        Route("/v1/messages/count_tokens", front.generation.count_tokens, methods=["POST"]),
        Route("/v1/responses/{response_id}", front.generation.stored_response, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", front.generation.cancel_response, methods=["POST"]),
        Route("/tokenize", front.tokenize, methods=["POST"]),
        Route("/detokenize", front.detokenize, methods=["POST"]),
        Route("/version", front.version, methods=["GET"]),
        Route("/health", front.health, methods=["GET"]),
        Route("/ping", front.ping, methods=["GET", "POST"]),
        Route("/load", front.load, methods=["GET"]),
        Route("/invocations", front.invocations, methods=["POST"]),
        Route("/stats", front.stats, methods=["GET"]),
        Route("/metrics", front.metrics, methods=["GET"]),
    ]
    if config.front.openapi:
        routes.append(Route("/openapi.json", front.openapi, methods=["GET"]))
    if config.front.runtime_lora_updating:
        adapters = LoraAdapterRoutes(front.dispatcher, front.intake)
        routes.append(Route("/v1/load_lora_adapter", adapters.load, methods=["POST"]))
        routes.append(Route("/v1/unload_lora_adapter", adapters.unload, methods=["POST"]))
    observer = RequestObserver(
        front.dispatcher.metrics,
        config.front.access_log,
        frozenset(config.front.access_log_skip_paths),
        LOAD_PATHS if config.front.server_load else frozenset(),
    )
    front.observer = observer
    app = FrontApp(
        routes=routes,
        middleware=middleware_for(config, observer),
        lifespan=front.lifespan,
        exception_handlers={
            APIError: _api_error_handler,
            HTTPException: _http_error_handler,
            Exception: _unexpected_error_handler,
        },
    )
    app.state.front = front
    app.root_path = config.front.root_path
    if not config.front.cors_allowed_origins:  # CORS needs the stack (edge.middleware_for) on every response
        app.direct = DirectRoutes(generation_routes, observer, _unexpected_error_handler)
    return app
