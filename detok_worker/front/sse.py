"""OpenAI-style server-sent events.

Every event is one `data: <json>` line plus a blank line; the stream ends with `data: [DONE]`. A request that
fails after the stream started (detokenizer error, engine reject, slow client, timeout) ends with an error
event `data: {"error": {"message", "type", "param", "code"}}` and then `data: [DONE]`, as OpenAI does (its
Python client raises APIError on such an event). finish_reason "abort" is a normal end: the engine aborted
the request.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NamedTuple, Protocol

from starlette.types import Receive, Scope, Send

from detok_worker.front.errors import APIError, encode_error

MEDIA_TYPE = "text/event-stream"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RAW_HEADERS = [
    (b"content-type", f"{MEDIA_TYPE}; charset=utf-8".encode()),
    *((name.lower().encode(), value.encode()) for name, value in HEADERS.items()),
]
DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it, proxies' read timeouts count it
# scope key of the server's own `send` (set by the app, outside every middleware): see EventStreamResponse
SERVER_SEND = "detok.server_send"


class HeadHolder(Protocol):
    """Holds what the server writes to the connection until release (edge.ConnectionWriter)."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


def event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def error_event(error: APIError) -> bytes:
    return event(encode_error(error))


class Framing(NamedTuple):
    """How a stream's chunks become events: `event` frames a chunk, `error_event` an error that ends the stream,
    `end` closes it."""

    event: Callable[[bytes], bytes]
    error_event: Callable[[APIError], bytes]
    end: bytes


OPENAI_FRAMING = Framing(event, error_event, DONE)


def named_event(kind: str, data: bytes) -> bytes:
    """An event with its type on an `event:` line before its data (Anthropic's and OpenAI's Responses streams)."""
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def named_events_framing(error_event: Callable[[APIError], bytes]) -> Framing:
    """The framing of a stream whose chunks are whole named events already; it ends with its last event."""
    return Framing(lambda chunk: chunk, error_event, b"")


class DisconnectWatch:
    """One task per streamed request that waits for the client's http.disconnect and then calls `on_disconnect`.
    The handler waiting for the stream's first output and then the response share it, each with its own callback
    (`retarget`): a second task per request cost as much again."""

    def __init__(self, receive: Receive, on_disconnect: Callable[[], None]) -> None:
        self._receive = receive
        self._on_disconnect = on_disconnect
        self._fired = False
        self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._fired = True
        self._on_disconnect()

    def retarget(self, on_disconnect: Callable[[], None]) -> None:
        """Call `on_disconnect` from now on (at once when the client has already gone)."""
        self._on_disconnect = on_disconnect
        if self._fired:
            on_disconnect()

    def cancel(self) -> None:
        self._task.cancel()


class EventStreamResponse:
    """A raw ASGI SSE response (no framework wrapper per chunk): sends each event of `events` as it comes (the
    chunk that ends with [DONE] as the body's last message: one socket write, not two, per stream end) and
    calls `on_close` when the response ends for any reason (finished, client disconnected, server shutdown), so
    the request can be aborted in the engine at once. A client that goes away while no event is due is noticed
    by a task waiting for its http.disconnect (`watch`, the request's own, else one of the response's), which
    cancels the stream.

    The headers go through the middleware stack (status for the access log, X-Request-Id, CORS); the body
    chunks go straight to the server's `send` (scope[SERVER_SEND], when the app put it there): every wrapper
    in between only looks at http.response.start, and four of them per chunk cost more than the write. With a
    `writer` (edge.ConnectionWriter) the head is held until the first events are sent (or the events' generator releases
    it before it waits), so they leave in one socket write."""

    def __init__(
        self,
        events: AsyncIterator[bytes],
        on_close: Callable[[], None],
        headers: Mapping[str, str] | None = None,
        writer: HeadHolder | None = None,
        watch: DisconnectWatch | None = None,
    ) -> None:
        self._events = events
        self._on_close = on_close
        self._writer = writer
        self._watch = watch
        extra = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in (headers or {}).items()]
        self._headers = [*RAW_HEADERS, *extra]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None
        disconnected = False

        def on_disconnect() -> None:
            nonlocal disconnected
            disconnected = True
            streaming.cancel()

        watcher = self._watch
        if watcher is None:
            watcher = DisconnectWatch(receive, on_disconnect)
        else:
            watcher.retarget(on_disconnect)
        writer = self._writer
        try:
            if writer is not None:
                writer.hold()
            await send({"type": "http.response.start", "status": 200, "headers": self._headers})
            send_body = scope.get(SERVER_SEND, send)
            async for chunk in self._events:
                last = chunk.endswith(DONE)  # the stream's last write carries the end of the body too
                await send_body({"type": "http.response.body", "body": chunk, "more_body": not last})
                if writer is not None:
                    writer.release()
                if last:
                    break
            else:
                await send_body({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not disconnected:
                raise
            if sys.version_info >= (3, 11):  # 3.10 keeps no cancel count to take back
                streaming.uncancel()  # the client went away: a normal end of the response
        except OSError:  # the client went away mid-write
            pass
        finally:
            if writer is not None:
                writer.release()
            watcher.cancel()
            self._on_close()
            aclose: Any = getattr(self._events, "aclose", None)
            if aclose is not None:
                await aclose()
