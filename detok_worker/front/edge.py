"""The front's HTTP edge: everything between uvicorn's connection and a route's handler, and the one module that
reaches below uvicorn's and Starlette's public API (a layout test holds it to that).

- **Connection limits uvicorn does not have.** uvicorn's protocols time out only idle keep-alive connections; a
  client trickling header lines (slowloris) would hold its connection, and a file descriptor, forever. The guarded
  protocol (uvicorn's httptools one: uvicorn[standard] installs it) arms a timer when a request starts (connection
  made, or the first byte of the next request on a keep-alive connection): the head must be complete within
  front.header_timeout_s, then the body within front.body_timeout_s, else the connection is closed. A connection
  beyond front.max_connections is answered 503 (Retry-After) and closed as soon as it is accepted.
- **X-Request-Id and CORS.** The client's X-Request-Id is echoed unchanged on the response; without one the front
  makes one (a uuid hex) and echoes that. Generation requests use it in their rid (`request_rid`), sanitised, so
  logs, traces and the response id tie back to the client's id. CORS is Starlette's CORSMiddleware, on only when
  front.cors_allowed_origins lists origins.
- **The access log and the per-request metrics** (`RequestObserver`), recorded once, when a response ends (a
  stream: after its last byte, a client disconnect or an error), never per token: the HTTP status by endpoint (the
  route template) and the duration, for generation requests also TTFT and the mean inter-token latency, and with
  front.access_log one INFO line on the `detok.access` logger, in logfmt:

      request_id=<X-Request-Id> rid=<bus rid|-> method=POST path=/v1/completions status=200 prompt_tokens=12
      completion_tokens=40 ttft_ms=8.1 duration_ms=95.3 end=length client=127.0.0.1:51234

  `end` is how a generation request ended: its finish reason (stop, length, abort), the error code when it failed
  (the HTTP status of a stream that started stays 200), or `disconnected` when the response ended first.
- **The generation routes past Starlette's stack** (`DirectRoutes`). Nearly every request a busy front serves is a
  generation request, and each paid for layers that only pass it on: Starlette's error middleware, the access-log
  and X-Request-Id middleware classes (each with its own wrapper of `send`), the exception middleware, the router's
  scan of every route, and the route's request_response wrapper. `DirectRoutes` does what those layers do for
  POST /v1/completions and /v1/chat/completions, in one function with one wrapper of `send`, in the same order: the
  request id in the scope and X-Request-Id on the head; the status and duration for `RequestObserver` (500 when the
  handler fails before any head, NO_RESPONSE when nothing was sent); an APIError becomes its error response (a
  RuntimeError once the head is out, as Starlette's handler wrapper); any other error is logged and answered with a
  500 when no head is out, then re-raised (as Starlette's ServerErrorMiddleware); the route, its endpoint and empty
  path params in the scope, as the router sets them. Other paths and methods, and every request while CORS is on
  (its middleware must see them), take the stack.
- **SSE events written from the bus intake** (`ConnectionWriter`, `EventSink`): a plain text stream's chunks go from
  the dispatcher straight to its client's connection, with no task wakeup per event. A response of any streaming API
  whose chunks depend on nothing but their text (responses.FormatterBase.text_event: no parsers, logprobs, token ids
  or running usage) gives each of its streams an EventSink. When a delta arrives, the stream hands its new text to the
  sink (request_stream.RequestStream.accept_text), which has the formatter make the event (OpenAI's chunk: a fixed
  template around the encoded text; Anthropic's and the Responses API's: their block step, which opens the text block
  and numbers the events) and writes it, as one HTTP/1.1 chunk, to the connection's transport, if the connection can
  take it now: the response's handler is parked waiting for news with nothing in hand (`armed`), the transport is not
  paused by flow control (a slow client), and the client is still there. Otherwise the text stays in the stream's
  buffer and the handler task writes it through the ASGI send, which waits for the slow client (bounded by the output
  budget): a slow client never holds anyone else back. The connection is uvicorn's httptools request-response cycle
  (the ASGI `send` the server gave the app is its bound method): a chunked response once its head is sent, whose body
  chunks carry no state in the cycle, so a chunk written here is the same bytes the cycle would write. Any other
  server (h11, an in-process test client) gets no writer: every event then goes through the handler task.
- **The draining server** (`DrainingServer`): the first stop signal drains the front before uvicorn shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import resource
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette._utils import get_route_path as route_path
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from detok_worker.config import DetokConfig, FrontConfig
from detok_worker.front.errors import APIError, error_response
from detok_worker.front.sse import SERVER_SEND

if TYPE_CHECKING:
    from detok_worker.front.choices import Choices
    from detok_worker.metrics import FrontMetrics

log = logging.getLogger(__name__)
access_log = logging.getLogger("detok.access")

FD_RESERVE = 256  # descriptors kept for everything that is not an HTTP connection (bus sockets, files, logs)
RETRY_AFTER_S = 1
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"retry-after: %d\r\ncontent-length: %d\r\n\r\n%s"
)
REFUSAL_BODY = (
    b'{"error":{"message":"too many open connections; try again later","type":"service_unavailable",'
    b'"param":null,"code":"too_many_connections"}}'
)
UNMATCHED = "unmatched"  # the endpoint label of a path no route serves (raw paths would explode the labels)
NO_RESPONSE = 499  # the status logged when the app sent no response (the client went away first)
_PLAIN_VALUE = re.compile(r"[!#-~]+")  # printable ASCII without space or '"': logged as is, anything else quoted

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()
MAX_REQUEST_ID_CHARS = 64
_UNSAFE_RID_CHARS = re.compile(r"[^A-Za-z0-9._:-]")


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(front: FrontConfig, fd_limit: int) -> int:
    """front.max_connections, lowered to stay FD_RESERVE below the file-descriptor limit."""
    cap = max(1, min(front.max_connections, fd_limit - FD_RESERVE))
    if cap < front.max_connections:
        log.warning("front.max_connections %d lowered to %d (open-file limit %d)", front.max_connections, cap, fd_limit)
    return cap


HEAD = "head"
BODY = "body"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a head/body deadline per request and the connection cap; the parser's
    callbacks say where the request is. The limits are set on the class by `guarded_protocol` (uvicorn builds
    protocols itself)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # HEAD, BODY, or None (nothing due from the client)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(REFUSAL % (RETRY_AFTER_S, len(REFUSAL_BODY), REFUSAL_BODY))
            transport.close()
        else:
            self._wait_for(HEAD)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._waiting_for is None:
            self._wait_for(HEAD)  # the first byte of the next request on a keep-alive connection
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._wait_for(BODY)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._wait_for(None)
        super().on_message_complete()

    def _wait_for(self, waiting_for: str | None) -> None:
        """Arm, move or cancel the deadline for what the client still has to send."""
        if waiting_for == self._waiting_for:
            return
        self._cancel_deadline()
        self._waiting_for = waiting_for
        if waiting_for is not None and not self.transport.is_closing():
            timeout = self.header_timeout_s if waiting_for == HEAD else self.body_timeout_s
            self._read_deadline = self.loop.call_later(timeout, self._read_timed_out)

    def _cancel_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()  # a handler reading the body sees a client disconnect


def guarded_protocol(front: FrontConfig, max_connections: int) -> type[GuardedHttpToolsProtocol]:
    """The guarded protocol as a subclass carrying this front's limits."""
    limits = {
        "header_timeout_s": front.header_timeout_s,
        "body_timeout_s": front.body_timeout_s,
        "max_connections": max_connections,
    }
    return type("FrontHttpProtocol", (GuardedHttpToolsProtocol,), limits)


class RequestIdMiddleware:
    """Puts the request id in scope["state"]["request_id"] and on every response as X-Request-Id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = tag_request_id(scope)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = with_header(message, header)
            await send(message)

        await self.app(scope, receive, send_with_id)


def tag_request_id(scope: Scope) -> tuple[bytes, bytes]:
    """Put the request id (the client's X-Request-Id, else a new uuid hex) in scope["state"]; returns the
    X-Request-Id header that every response of the request carries."""
    given = next((value for key, value in scope["headers"] if key == _REQUEST_ID_KEY), b"")
    request_id = given.decode("latin-1").strip() or uuid.uuid4().hex
    state: dict[str, Any] = scope.setdefault("state", {})
    state["request_id"] = request_id
    state["client_request_id"] = bool(given.strip())
    return (_REQUEST_ID_KEY, request_id.encode("latin-1"))


def with_header(start: Message, header: tuple[bytes, bytes]) -> Message:
    """An http.response.start message with `header` added after its own."""
    return {**start, "headers": [*start.get("headers", []), header]}


def request_rid(request: Request, prefix: str, body_request_id: str | None = None) -> str:
    """The rid of a generation request, also its answer's id: `{prefix}{id}` with the front's own id (`prefix`:
    the API's, e.g. "chatcmpl-", "resp_"), `{prefix}{client id}-{12 hex}` with a client's (X-Request-Id, else
    vLLM's `request_id` body field): sanitised and made unique, since a client may reuse its ids while the bus needs
    each live rid once."""
    state = request.state
    client_id = state.request_id if state.client_request_id else body_request_id
    if not client_id:
        return f"{prefix}{state.request_id}"
    safe = _UNSAFE_RID_CHARS.sub("_", client_id)[:MAX_REQUEST_ID_CHARS]
    return f"{prefix}{safe}-{uuid.uuid4().hex[:12]}"


def middleware_for(config: DetokConfig, observer: RequestObserver) -> list[Middleware]:
    """The stack, outermost first: the access log and per-request metrics see every response (CORS preflights
    too), then CORS, then X-Request-Id. (The generation routes skip it while CORS is off: `DirectRoutes`.)"""
    front = config.front
    stack = [Middleware(RequestLogMiddleware, observer=observer)]
    if front.cors_allowed_origins:
        stack.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(front.cors_allowed_origins),
                allow_methods=list(front.cors_allowed_methods),
                allow_headers=list(front.cors_allowed_headers),
                allow_credentials=front.cors_allow_credentials,
                expose_headers=["X-Request-Id"],
            )
        )
    stack.append(Middleware(RequestIdMiddleware))
    return stack


def stream_of(scope: Scope) -> Choices | None:
    """The generation request's choices (their streams), which the handler puts in the request's state."""
    state: dict[str, Any] = scope.get("state") or {}
    return state.get("stream")


class RequestObserver:
    """What is recorded once per HTTP request when its response ends: the metrics and the access log line.
    RequestLogMiddleware calls it for the routes behind Starlette's stack, `DirectRoutes` for the generation
    routes."""

    def __init__(
        self,
        metrics: FrontMetrics,
        log_requests: bool,
        skip_paths: frozenset[str] = frozenset(),
        load_paths: frozenset[str] = frozenset(),
    ) -> None:
        """`skip_paths`: paths the access log leaves out (their metrics are recorded all the same); `load_paths`:
        the paths whose requests in flight `load` counts (vLLM's server load, /load)."""
        self.metrics = metrics
        self.log_requests = log_requests
        self.skip_paths = skip_paths
        self.load_paths = load_paths
        self.load = 0
        if log_requests:  # the access log is its own switch: --log-level WARNING does not silence it
            access_log.setLevel(logging.INFO)

    def begin(self, scope: Scope) -> float:
        """A request reached the app; returns the time observe() takes as its start."""
        if route_path(scope) in self.load_paths:
            self.load += 1
        return time.monotonic()

    def observe(self, scope: Scope, status: int, started: float) -> None:
        """`status`: the response's, 500 for an unhandled error before any response, NO_RESPONSE when none was
        sent; `started`: time.monotonic() when the request reached the app."""
        duration = time.monotonic() - started
        if route_path(scope) in self.load_paths:
            self.load -= 1
        endpoint = getattr(scope.get("route"), "path", UNMATCHED)
        self.metrics.response(endpoint, status, duration)
        stream = stream_of(scope)
        ttft = None
        if stream is not None:
            ttft = stream.ttft_s(started)
            self.metrics.generation(endpoint, ttft, stream.mean_itl_s())
        if self.log_requests and route_path(scope) not in self.skip_paths:
            access_log.info(access_line(scope, status, duration, stream, ttft))


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, observer: RequestObserver) -> None:
        self.app = app
        self.observer = observer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = self.observer.begin(scope)
        status = 0

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        except BaseException:
            status = status or 500  # Starlette's outermost error handler answers an unhandled error with a 500
            raise
        finally:
            self.observer.observe(scope, status or NO_RESPONSE, started)


def access_line(scope: Scope, status: int, duration: float, stream: Choices | None, ttft: float | None) -> str:
    state: dict[str, Any] = scope.get("state") or {}
    client = scope.get("client")
    fields = [
        f"request_id={_value(state.get('request_id', '-'))}",
        f"rid={stream.rid if stream is not None else '-'}",
        f"method={scope['method']}",
        f"path={_value(scope['path'])}",
        f"status={status}",
        f"prompt_tokens={stream.prompt_tokens if stream is not None else '-'}",
        f"completion_tokens={stream.n_tokens if stream is not None else '-'}",
        f"ttft_ms={ttft * 1000:.1f}" if ttft is not None else "ttft_ms=-",
        f"duration_ms={duration * 1000:.1f}",
        f"end={end_of(stream) if stream is not None else '-'}",
        f"client={client[0]}:{client[1]}" if client else "client=-",
    ]
    return " ".join(fields)


def end_of(stream: Choices) -> str:
    if stream.failure is not None:
        return stream.failure.code or stream.failure.type
    if stream.finish is not None:
        return stream.finish
    return "disconnected"


def _value(value: object) -> str:
    text = str(value)
    return text if _PLAIN_VALUE.fullmatch(text) else json.dumps(text)


ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]
# what Starlette's handler wrapper raises for a handled error after the response head was sent
STARTED_MESSAGE = "Caught handled exception, but response already started."


class DirectRoutes:
    def __init__(self, routes: Iterable[Route], observer: RequestObserver, on_unexpected: ErrorHandler) -> None:
        self._routes = {route.path: route for route in routes}
        self._observer = observer
        self._on_unexpected = on_unexpected

    def match(self, scope: Scope) -> Route | None:
        """The route when `scope` is a POST to one of the direct paths, else None (the stack serves it)."""
        if scope["type"] != "http" or scope["method"] != "POST":
            return None
        return self._routes.get(route_path(scope))

    async def serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        started = self._observer.begin(scope)
        header = tag_request_id(scope)
        status = 0

        async def send_tagged(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = with_header(message, header)
            await send(message)

        scope["route"] = route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        request = Request(scope, receive, send_tagged)
        try:
            try:
                response = await route.endpoint(request)
                await response(scope, receive, send_tagged)
            except APIError as exc:
                if status:
                    raise RuntimeError(STARTED_MESSAGE) from exc
                await error_response(exc)(scope, receive, send_tagged)
        except BaseException as exc:
            self._observer.observe(scope, status or 500, started)
            if isinstance(exc, Exception) and not status:
                await (await self._on_unexpected(request, exc))(scope, receive, send)
            raise
        self._observer.observe(scope, status or NO_RESPONSE, started)


class _HeldTransport:
    """Stands in for the connection's transport in the cycle while the response's head is held: what the cycle
    writes is kept, and goes out in one write with what follows (ConnectionWriter.release, or a close)."""

    __slots__ = ("_transport", "data")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.data: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.data.append(data)

    def flush(self) -> None:
        if self.data:
            self._transport.write(b"".join(self.data))
            self.data.clear()

    def is_closing(self) -> bool:
        return bool(self._transport.is_closing())

    def close(self) -> None:
        self.flush()
        self._transport.close()


class ConnectionWriter:
    """One response's connection, for writes from the intake. `armed` is set by the response's handler only while
    it waits for news with nothing taken and not written: a direct write then cannot overtake text in its hands.

    `hold` keeps what the cycle writes (the head, then the first events) until `release` (or `arm`), so a stream's
    head and its first events leave in one socket write: a short answer is one write, not three."""

    __slots__ = ("_cycle", "_transport", "_flow", "armed")

    def __init__(self, cycle: Any) -> None:
        self._cycle = cycle
        self._transport = cycle.transport
        self._flow = cycle.flow
        self.armed = False

    def hold(self) -> None:
        if self._cycle.transport is self._transport:
            self._cycle.transport = _HeldTransport(self._transport)

    def release(self) -> None:
        held = self._cycle.transport
        if held is not self._transport:
            self._cycle.transport = self._transport
            held.flush()

    def arm(self) -> None:
        """The handler waits for news with nothing in hand: what is held goes out, and the intake may write."""
        self.release()
        self.armed = True

    def ready(self) -> bool:
        """Whether a chunk written now goes out in order: armed, a started chunked body, not paused by flow control,
        the client still there."""
        cycle = self._cycle
        return (
            self.armed
            and not self._flow.write_paused
            and cycle.chunked_encoding
            and not cycle.disconnected
            and not cycle.response_complete
            and not self._transport.is_closing()
        )

    def write(self, chunk: bytes) -> None:
        self._transport.write(chunk)


# the cycle's state a ConnectionWriter reads and swaps: another uvicorn release without one of these gets no writer
_CYCLE_FIELDS = ("transport", "flow", "chunked_encoding", "disconnected", "response_complete")


def connection_writer(scope: Scope) -> ConnectionWriter | None:
    """The writer of this request's connection: only on uvicorn's httptools protocol, and only when its cycle has
    the fields the writer uses, else None (every event then goes through the ASGI send)."""
    send = scope.get(SERVER_SEND)
    cycle = getattr(send, "__self__", None)
    if not isinstance(cycle, RequestResponseCycle) or scope.get("method") == "HEAD":
        return None
    if not all(hasattr(cycle, name) for name in _CYCLE_FIELDS) or not hasattr(cycle.flow, "write_paused"):
        return None
    return ConnectionWriter(cycle)


class EventSink:
    """One choice's text events on a ConnectionWriter, each as one HTTP/1.1 chunk; `event` makes them from the text
    (responses.FormatterBase.text_event: the formatter's own bytes and state), only once the connection takes them."""

    __slots__ = ("_writer", "_event")

    def __init__(self, writer: ConnectionWriter, event: Callable[[str], bytes]) -> None:
        self._writer = writer
        self._event = event

    def write(self, text: str) -> bool:
        writer = self._writer
        if not writer.ready():
            return False
        event = self._event(text)
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        return True


TICK_S = 1.0  # uvicorn's per-second work (the Date header); an exit request wakes the loop at once


class DrainingServer(uvicorn.Server):
    """uvicorn's server, except that the first stop signal drains the front (`drain`) before shutting down. It
    overrides uvicorn's `main_loop` and the `should_exit` attribute, which are not uvicorn's documented API."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        # before uvicorn's __init__, which sets should_exit (the setter below reads these)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_requested = asyncio.Event()
        super().__init__(config)
        self._drain_front = drain
        self._drain: asyncio.Task[None] | None = None

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Set by signal handlers, the drain and other threads: wakes `main_loop` (thread-safe)."""
        self._should_exit = value
        if value and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self._exit_requested.set)

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def main_loop(self) -> None:
        """uvicorn's own loop wakes ten times a second to look at should_exit; this one waits for it, and wakes
        once a second for on_tick's per-second work (its counter is a multiple of 10 at every call)."""
        counter = 0
        while not await self.on_tick(counter):
            counter += 10
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), TICK_S)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain is not None:  # not serving yet, or a second signal: stop now
            self.force_exit = self._drain is not None
            super().handle_exit(sig, frame)
            return
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self._drain_front()
        finally:
            self.should_exit = True
