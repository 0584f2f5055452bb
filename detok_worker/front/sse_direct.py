"""SSE events written from the bus intake: a plain text stream's chunks go from the dispatcher straight to its
client's connection, with no task wakeup per event.

A response whose chunks depend on nothing but their text (responses.FormatterBase.text_event_parts: no parsers,
logprobs, token ids or running usage) gives each of its streams an EventSink. When a delta arrives, the stream
hands its new text to the sink (request_stream.RequestStream.accept_text), which encodes the event around it and
writes it, as one HTTP/1.1 chunk, to the connection's transport, if the connection can take it now: the response's
handler is parked waiting for news with nothing in hand (`armed`), the transport is not paused by flow control
(its buffer is over the high-water mark: a slow client), and the client is still there. Otherwise the text stays
in the stream's buffer and the handler task writes it through the ASGI send, which waits for the slow client
(bounded by the output budget, as before): a slow client never holds anyone else back.

The connection is uvicorn's httptools request-response cycle (the ASGI `send` the server gave the app is its
bound method): a chunked response once its head is sent, whose body chunks carry no state in the cycle, so a chunk
written here is the same bytes the cycle would write. The head, the end of the body and everything else still go
through the cycle's `send`. Any other server (h11, an in-process test client) gets no writer: every event then goes
through the handler task.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.types import Scope

from detok_worker.front.sse import SERVER_SEND

try:
    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
except ImportError:  # httptools not installed: no direct writes
    RequestResponseCycle = None  # type: ignore[assignment,misc]

_encode = msgspec.json.encode


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
    if RequestResponseCycle is None or not isinstance(cycle, RequestResponseCycle) or scope.get("method") == "HEAD":
        return None
    if not all(hasattr(cycle, name) for name in _CYCLE_FIELDS) or not hasattr(cycle.flow, "write_paused"):
        return None
    return ConnectionWriter(cycle)


class EventSink:
    """One choice's text events on a ConnectionWriter: the event's bytes before and after its JSON-encoded text are
    fixed (responses.ChunkTemplate), so per event only the text is encoded."""

    __slots__ = ("_writer", "_prefix", "_suffix", "_framing")

    def __init__(self, writer: ConnectionWriter, prefix: bytes, suffix: bytes) -> None:
        self._writer = writer
        self._prefix = prefix  # b"data: " + the chunk's JSON up to its text
        self._suffix = suffix + b"\r\n"  # the JSON after its text, the event's blank line, the HTTP chunk's end
        self._framing = len(prefix) + len(suffix)

    def write(self, text: str) -> bool:
        writer = self._writer
        if not writer.ready():
            return False
        payload = _encode(text)
        writer.write(b"".join((b"%x\r\n" % (self._framing + len(payload)), self._prefix, payload, self._suffix)))
        return True
