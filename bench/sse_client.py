"""A deliberately minimal asyncio HTTP/1.1 client for streamed completions (bench_http, bench_gateway, bench_vllm).

A full client (httpx, openai) parses every SSE chunk as JSON and costs more CPU per chunk than the server spends
producing it; with a thousand streams on a 2-core machine the load generator would be what is measured. This one
sends a fixed request, decodes the chunked body, splits SSE events, and looks at an event's bytes only to tell
whether it carries text; it parses JSON once per stream, for the usage chunk at the end. A caller that checks the
text passes `capture`: the stream's raw SSE events are kept there, to be parsed after the measurement
(`parse_stream`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit


def install_uvloop() -> None:
    """Run the clients on uvloop when it is installed: less of the load generator's CPU per chunk."""
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()


EMPTY_TEXT = (b'"text":""', b'"content":""')
TEXT_KEYS = (b'"text":"', b'"content":"', b'"delta":"')  # OpenAI's and Anthropic's deltas; the Responses API's


def is_text(event: bytes) -> bool:
    """Whether an SSE event carries text."""
    return any(key in event for key in TEXT_KEYS) and not any(empty in event for empty in EMPTY_TEXT)


def output_tokens(event: bytes) -> int:
    """The output tokens a usage event counts: OpenAI's usage chunk, Anthropic's message_start and message_delta,
    the Responses API's response.completed."""
    data = json.loads(event[event.index(b"data: ") + len(b"data: ") :])
    usage = data.get("usage") or data.get("response", {}).get("usage") or {}
    return int(usage.get("completion_tokens", usage.get("output_tokens", 0)))


class StreamFailedError(Exception):
    """The server answered with a status other than 200, or the connection broke mid-stream."""


@dataclass
class StreamStats:
    tokens: int = 0
    requests: int = 0
    events: int = 0  # SSE events delivered, [DONE] included
    errors: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)


class ChunkedDecoder:
    """Incremental decoder of an HTTP/1.1 chunked body."""

    def __init__(self) -> None:
        self._buffer = b""
        self._remaining = 0  # data bytes of the current chunk still to come
        self._crlf = False  # the CRLF after a chunk's data is still to be skipped
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out: list[bytes] = []
        while self._buffer and not self.done:
            if self._remaining:
                take = self._buffer[: self._remaining]
                out.append(take)
                self._buffer = self._buffer[len(take) :]
                self._remaining -= len(take)
                self._crlf = not self._remaining
            elif self._crlf:
                if len(self._buffer) < 2:
                    break
                self._buffer, self._crlf = self._buffer[2:], False
            else:
                line_end = self._buffer.find(b"\r\n")
                if line_end < 0:
                    break
                self._remaining = int(self._buffer[:line_end].split(b";")[0], 16)
                self._buffer = self._buffer[line_end + 2 :]
                self.done = self._remaining == 0
        return b"".join(out)


async def stream_completion(
    url: str, path: str, body: bytes, stats: StreamStats, capture: list[bytes] | None = None
) -> None:
    """POST `body` to url+path and read the SSE stream to its end, recording TTFT, chunk gaps and usage."""
    parts = urlsplit(url)
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    except OSError:
        stats.errors += 1
        return
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        writer.write(head + body)
        header = await reader.readuntil(b"\r\n\r\n")
        if header.split(b" ", 2)[1] != b"200":
            raise StreamFailedError(header.split(b"\r\n", 1)[0].decode(errors="replace"))
        chunked = b"transfer-encoding: chunked" in header.lower()
        usage = await _read_events(reader, chunked, start, stats, capture)
    except (StreamFailedError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
        stats.errors += 1
        if capture is not None:
            capture.append(f"failed: {exc!r}".encode())
        return
    finally:
        writer.close()
    stats.requests += 1
    stats.tokens += usage


async def _read_events(
    reader: asyncio.StreamReader, chunked: bool, start: float, stats: StreamStats, capture: list[bytes] | None
) -> int:
    decoder = ChunkedDecoder() if chunked else None
    pending = b""
    last: float | None = None
    usage = 0
    while True:
        data = await reader.read(65536)
        if not data:
            break
        pending += decoder.feed(data) if decoder is not None else data
        *events, pending = pending.split(b"\n\n")
        now = time.perf_counter()
        stats.events += len(events)
        if capture is not None:
            capture.extend(events)
        for event in events:
            if b'"usage":{' in event:
                usage = output_tokens(event)
            elif is_text(event):
                if last is None:
                    stats.ttft_ms.append((now - start) * 1000)
                else:
                    stats.gaps_ms.append((now - last) * 1000)
                last = now
        if decoder is not None and decoder.done:
            break
    return usage


@dataclass
class StreamOutput:
    """What one captured stream said: its text, the ids its chunks carried (vLLM's `return_token_ids`), its error."""

    text: str
    token_ids: list[int]
    error: str | None


def parse_stream(events: list[bytes]) -> StreamOutput:
    """The text of a captured SSE stream's text/content deltas, the chunks' token ids, and its error (a failed
    connection or an error event) or None."""
    parts: list[str] = []
    ids: list[int] = []
    for event in events:
        if event.startswith(b"failed: "):
            return StreamOutput("".join(parts), ids, event.decode(errors="replace"))
        data = event.strip()[len(b"data: ") :]
        if not data or data == b"[DONE]":
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            return StreamOutput("".join(parts), ids, str(chunk["error"]))
        for choice in chunk.get("choices", []):
            parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            ids.extend(choice.get("token_ids") or ())
    return StreamOutput("".join(parts), ids, None)
