"""EventStreamResponse's ASGI messages: the headers, each event as it comes, and the end of the body in the same
message as the [DONE] event (one socket write at the end of a stream, not two)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from detok_worker.front import sse


async def events_of(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def run_response(*chunks: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    sent: list[dict[str, Any]] = []
    closed: list[str] = []

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)  # the client never leaves
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    response = sse.EventStreamResponse(events_of(*chunks), on_close=lambda: closed.append("closed"))
    asyncio.run(response({"type": "http"}, receive, send))
    return sent, closed


def test_the_done_event_ends_the_body_in_the_same_message() -> None:
    first, text = sse.event(b'{"a": 1}'), sse.event(b'{"b": 2}')
    last = sse.event(b'{"usage": 3}') + sse.DONE
    sent, closed = run_response(first, text, last)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    bodies = [(message["body"], message["more_body"]) for message in sent[1:]]
    assert bodies == [(first, True), (text, True), (last, False)]
    assert closed == ["closed"]


def test_events_that_end_without_done_still_end_the_body() -> None:
    text = sse.event(b'{"b": 2}')
    sent, closed = run_response(text)
    bodies = [(message["body"], message["more_body"]) for message in sent[1:]]
    assert bodies == [(text, True), (b"", False)]
    assert closed == ["closed"]
