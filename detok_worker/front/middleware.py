"""ASGI middleware of the front: X-Request-Id (honoured, echoed, the base of the request's rid), CORS, and the
access log with the per-request metrics (request_log.py).

X-Request-Id: the client's value is echoed unchanged on the response; without one the front makes one (a uuid
hex) and echoes that. Generation requests use it in their rid (`request_rid`), sanitised, so logs, traces and
the response id tie back to the client's id. CORS is Starlette's CORSMiddleware, on only when
front.cors_allowed_origins lists origins.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from detok_worker.config import DetokConfig
from detok_worker.front.request_log import RequestLogMiddleware, RequestObserver

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_KEY = REQUEST_ID_HEADER.encode()
MAX_REQUEST_ID_CHARS = 64
_UNSAFE_RID_CHARS = re.compile(r"[^A-Za-z0-9._:-]")


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


def request_rid(request: Request, kind: str, body_request_id: str | None = None) -> str:
    """The rid of a generation request: `{kind}-{id}` with the front's own id, `{kind}-{client id}-{12 hex}` with
    a client's (X-Request-Id, else vLLM's `request_id` body field): sanitised and made unique, since a client
    may reuse its ids while the bus needs each live rid once."""
    state = request.state
    client_id = state.request_id if state.client_request_id else body_request_id
    if not client_id:
        return f"{kind}-{state.request_id}"
    safe = _UNSAFE_RID_CHARS.sub("_", client_id)[:MAX_REQUEST_ID_CHARS]
    return f"{kind}-{safe}-{uuid.uuid4().hex[:12]}"


def middleware_for(config: DetokConfig, observer: RequestObserver) -> list[Middleware]:
    """The stack, outermost first: the access log and per-request metrics see every response (CORS preflights
    too), then CORS, then X-Request-Id. (The generation routes skip it while CORS is off: direct_route.py.)"""
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
