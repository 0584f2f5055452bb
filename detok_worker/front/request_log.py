"""The front's one place per HTTP request for observability: the access log line and the per-request metrics.

RequestLogMiddleware wraps the whole app (outermost), so it sees every response, a stream's included: its work
is done once, when the response ends (a stream: after its last byte, a client disconnect or an error), never per
token or per delta. Per request it records the HTTP status by endpoint (the route template) and the duration,
for generation requests also TTFT and the mean inter-token latency (each RequestStream keeps two clock readings), and
with front.access_log writes one INFO line on the `detok.access` logger, in logfmt:

    request_id=<X-Request-Id> rid=<bus rid|-> method=POST path=/v1/completions status=200 prompt_tokens=12
    completion_tokens=40 ttft_ms=8.1 duration_ms=95.3 end=length client=127.0.0.1:51234

`end` is how a generation request ended: its finish reason (stop, length, abort), the error code when it
failed (the HTTP status of a stream that started stays 200), or `disconnected` when the response ended first.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from starlette._utils import get_route_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from detok_worker.bus.messages import RequestParams
from detok_worker.front.choices import Choices
from detok_worker.metrics import FrontMetrics
from detok_worker.parse.base import ParsedOutput

access_log = logging.getLogger("detok.access")
request_log = logging.getLogger("detok.requests")

UNMATCHED = "unmatched"  # the endpoint label of a path no route serves (raw paths would explode the labels)
NO_RESPONSE = 499  # the status logged when the app sent no response (the client went away first)
_PLAIN_VALUE = re.compile(r"[!#-~]+")  # printable ASCII without space or '"': logged as is, anything else quoted


def log_request(rid: str, params: RequestParams, prompt_ids: list[int], max_len: int) -> None:
    """A generation request as it goes to the engine (front.log_requests): its rid, parameters and prompt ids, at
    most max_len of them (0: all)."""
    shown = prompt_ids[:max_len] if max_len else prompt_ids
    more = f" ... ({len(prompt_ids)} ids)" if len(shown) < len(prompt_ids) else ""
    request_log.info("request %s: params %r, prompt_token_ids %s%s", rid, params, shown, more)


class OutputLog:
    """A chat's output on the `detok.requests` logger (front.log_outputs), in vLLM's server's lines: each streamed
    piece (with front.log_deltas) and each choice's text at the stream's end, or each choice of a whole answer. The
    text is cut to max_len characters (0: all)."""

    def __init__(self, rid: str, max_len: int, deltas: bool) -> None:
        self.rid = rid
        self.max_len = max_len
        self.deltas = deltas
        self._texts: dict[int, list[str]] = {}

    def piece(self, index: int, news: str | ParsedOutput, finish: str | None) -> None:
        """A streamed piece of choice `index` (`finish`: its finish reason when it ended with it)."""
        if isinstance(news, str):
            parts = [news] if news else []
            self._texts.setdefault(index, []).append(news)
        else:
            parts = [news.content] if news.content else []
            if news.reasoning:
                parts.append(f"[reasoning: {news.reasoning}]")
            arguments = "".join(call.arguments for call in news.tool_calls)
            if arguments:
                parts.append(f"[tool_calls: {arguments}]")
            self._texts.setdefault(index, []).append(news.reasoning + news.content)
        if parts and self.deltas:
            self._line(" (streaming delta)", " ".join(parts), finish)

    def stream_end(self, choices: int) -> None:
        for index in range(choices):
            self._line(" (streaming complete)", "".join(self._texts.get(index, ())), "streaming_complete")

    def whole(self, body: dict[str, Any]) -> None:
        """Each choice of a whole chat answer: its content, or its calls."""
        for choice in body.get("choices", ()):
            message = choice.get("message") or {}
            text = message.get("content") or ""
            if not text and message.get("tool_calls"):
                calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in message["tool_calls"]]
                text = f"[tool_calls: {', '.join(calls)}]"
            if text:
                self._line("", text, choice.get("finish_reason"))

    def _line(self, kind: str, text: str, finish: str | None) -> None:
        shown = text[: self.max_len] if self.max_len else text
        request_log.info("Generated response %s%s: output: %r, finish_reason: %s", self.rid, kind, shown, finish)


def stream_of(scope: Scope) -> Choices | None:
    """The generation request's choices (their streams), which the handler puts in the request's state."""
    state: dict[str, Any] = scope.get("state") or {}
    return state.get("stream")


class RequestObserver:
    """What is recorded once per HTTP request when its response ends: the metrics and the access log line.
    RequestLogMiddleware calls it for the routes behind Starlette's stack, direct_route.py for the generation
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
        if get_route_path(scope) in self.load_paths:
            self.load += 1
        return time.monotonic()

    def observe(self, scope: Scope, status: int, started: float) -> None:
        """`status`: the response's, 500 for an unhandled error before any response, NO_RESPONSE when none was
        sent; `started`: time.monotonic() when the request reached the app."""
        duration = time.monotonic() - started
        if get_route_path(scope) in self.load_paths:
            self.load -= 1
        endpoint = getattr(scope.get("route"), "path", UNMATCHED)
        self.metrics.response(endpoint, status, duration)
        stream = stream_of(scope)
        ttft = None
        if stream is not None:
            ttft = stream.ttft_s(started)
            self.metrics.generation(endpoint, ttft, stream.mean_itl_s())
        if self.log_requests and get_route_path(scope) not in self.skip_paths:
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
