"""Connection-level limits uvicorn does not have: a request head (and then its body) must arrive within a time
limit, and the number of open connections is capped below the file-descriptor limit.

uvicorn's protocols (httptools, h11) time out only idle keep-alive connections; a client trickling header lines
(slowloris) would hold its connection, and a file descriptor, forever. The guarded protocols (httptools by
default, h11 without it) arm a timer when a request starts (connection made, or the first byte of the next
request on a keep-alive connection): the head must be complete within front.header_timeout_s, then the body
within front.body_timeout_s, else the connection is closed. A connection beyond front.max_connections is
answered 503 (Retry-After) and closed as soon as it is accepted, before it can hold anything.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools not installed: h11 (pure Python, slower per request)
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

from detok_worker.config import FrontConfig

log = logging.getLogger(__name__)

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


class ReadGuard:
    """The deadline and cap logic shared by both guarded protocols (mixed in before uvicorn's protocol class)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 10_000
    transport: asyncio.Transport
    connections: set[Any]
    loop: asyncio.AbstractEventLoop

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None  # HEAD, BODY, or None (nothing due from the client)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def _refuse_over_cap(self, transport: asyncio.Transport) -> bool:
        if len(self.connections) <= self.max_connections:
            return False
        transport.write(REFUSAL % (RETRY_AFTER_S, len(REFUSAL_BODY), REFUSAL_BODY))
        transport.close()
        return True

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


class GuardedH11Protocol(ReadGuard, H11Protocol):
    """uvicorn's h11 protocol plus a head/body deadline per request and the connection cap. The limits are set
    on the class by `guarded_protocol` (uvicorn builds protocols itself)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._refuse_over_cap(transport):
            self._watch_reading()

    def data_received(self, data: bytes) -> None:
        if self._waiting_for is None:
            self._watch_reading()  # the first byte of the next request on a keep-alive connection
        super().data_received(data)
        self._watch_reading()

    def _watch_reading(self) -> None:
        state = self.conn.their_state
        self._wait_for(HEAD if state is h11.IDLE else BODY if state is h11.SEND_BODY else None)


class GuardedHttpToolsProtocol(ReadGuard, HttpToolsProtocol):
    """The same guard on uvicorn's httptools protocol (the default: its parser costs a fraction of h11's per
    request); the parser's callbacks say where the request is."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self._refuse_over_cap(transport):
            self._wait_for(HEAD)

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


def guarded_protocol(front: FrontConfig, max_connections: int) -> type[ReadGuard]:
    """The guarded protocol (httptools when installed, else h11) as a subclass carrying this front's limits."""
    limits = {
        "header_timeout_s": front.header_timeout_s,
        "body_timeout_s": front.body_timeout_s,
        "max_connections": max_connections,
    }
    base = GuardedHttpToolsProtocol if HttpToolsProtocol is not None else GuardedH11Protocol
    return type("FrontHttpProtocol", (base,), limits)
