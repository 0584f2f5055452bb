"""Events written from the intake (front/edge.py): a plain text stream's chunk goes to its connection as the same
bytes uvicorn's own send writes, only while the handler waits with nothing in hand and the connection takes it;
otherwise the text is buffered for the handler, and once buffered later text queues behind it (order kept)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from detok_worker.bus.messages import DetokParams, TextDelta
from detok_worker.front import sse
from detok_worker.front.anthropic_api import MessagesFormatter
from detok_worker.front.edge import ConnectionWriter, EventSink, connection_writer
from detok_worker.front.openai_responses import ResponsesFormatter
from detok_worker.front.request_stream import RequestStream
from detok_worker.front.responses import ChatFormatter, ChunkUsage, CompletionFormatter
from detok_worker.stream.stop.rules import StopLimits, StopRules


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closing


def started_cycle() -> tuple[RequestResponseCycle, Transport]:
    """A real uvicorn httptools cycle on a fake transport, its chunked SSE head already sent."""
    transport = Transport()
    log = logging.getLogger("test")
    cycle = RequestResponseCycle(
        scope={"method": "POST", "type": "http"},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=log,
        access_logger=log,
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    asyncio.run(cycle.send({"type": "http.response.start", "status": 200, "headers": sse.RAW_HEADERS}))
    transport.written.clear()
    return cycle, transport


def uvicorn_bytes(body: bytes) -> bytes:
    """What uvicorn's own send writes for one more_body chunk of `body`."""
    cycle, transport = started_cycle()
    asyncio.run(cycle.send({"type": "http.response.body", "body": body, "more_body": True}))
    return b"".join(transport.written)


def stream_with_sink(formatter: Any) -> tuple[RequestStream, ConnectionWriter, RequestResponseCycle, Transport]:
    cycle, transport = started_cycle()
    writer = connection_writer({sse.SERVER_SEND: cycle.send, "method": "POST"})
    assert writer is not None
    stream = RequestStream("r", 3, 1e18, StopRules.from_params(DetokParams(), StopLimits()))
    event = formatter.text_event(0, stream)
    assert event is not None
    stream.sink = EventSink(writer, event)
    return stream, writer, cycle, transport


FORMATTERS = [
    lambda: CompletionFormatter("cmpl-a", "m", ChunkUsage(True, False)),
    lambda: ChatFormatter("chatcmpl-a", "m", ChunkUsage(False, False)),
]


@pytest.mark.parametrize("make_formatter", FORMATTERS)
@pytest.mark.parametrize("text", ["plain", 'quote " \\ \n \x00', "é 中文 🙂"])
def test_a_direct_write_is_the_bytes_uvicorn_writes(make_formatter: Any, text: str) -> None:
    formatter = make_formatter()
    stream, writer, _, transport = stream_with_sink(formatter)
    writer.armed = True
    assert stream.accept_text(0, text, 1) == text
    assert transport.written == [uvicorn_bytes(sse.event(formatter.text_chunk(0, text, stream)))]
    assert (stream.has_news, stream.pending_chars, stream.wakeup.is_set()) == (False, 0, False)


@pytest.mark.parametrize("formatter_type", [MessagesFormatter, ResponsesFormatter])
def test_a_block_streams_direct_writes_are_its_handler_path_events(
    formatter_type: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anthropic's and the Responses API's text events written from the intake are the events the handler writes
    for the same deltas (the text block opened once, the events numbered on), and the events after them (the block's
    close with its whole text, the usage) come out the same."""
    texts = ["Hello", ' "quoted" \\ \n', "é 中文 🙂"]

    def run(direct: bool) -> tuple[list[bytes], bytes]:
        ids = itertools.count()
        monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(ids)))  # item ids and signatures
        formatter = formatter_type("resp-a", "m", ChunkUsage(True, False))
        formatter.created = 0
        stream, writer, _, transport = stream_with_sink(formatter)
        events = formatter.first_chunks(0, stream)
        offset = 0
        for n_tokens, text in enumerate(texts, 1):
            writer.armed = direct  # else the text is buffered, and the handler takes it
            assert stream.accept_text(offset, text, n_tokens) == text and stream.has_news is not direct
            if not direct:
                events.append(uvicorn_bytes(formatter.text_chunk(0, stream.take(), stream)))
            offset += len(text)
        stream.accept(TextDelta("r", offset, "", len(texts), finish="length"))
        tail = formatter.final_chunk(0, stream) + formatter.usage_chunk(SimpleNamespace(streams=[stream]))
        return events + transport.written, tail

    handler_events, handler_tail = run(direct=False)
    assert run(direct=True) == (handler_events, handler_tail)
    assert len(handler_events) == len(texts) + (1 if formatter_type is MessagesFormatter else 2)


def test_text_is_buffered_unless_the_handler_is_parked_and_the_connection_takes_it() -> None:
    formatter = CompletionFormatter("cmpl-a", "m", ChunkUsage(True, False))
    stream, writer, cycle, transport = stream_with_sink(formatter)
    stream.accept_text(0, "a", 1)  # not armed: the handler holds or writes something
    assert (transport.written, stream.pending_chars, stream.wakeup.is_set()) == ([], 1, True)
    writer.armed = True
    stream.accept_text(1, "b", 2)  # armed, but text is buffered: "b" must not overtake "a"
    assert (transport.written, stream.take()) == ([], "ab")
    cycle.flow.pause_writing()  # a slow client: over the transport's high-water mark
    stream.accept_text(2, "c", 3)
    cycle.flow.resume_writing()
    assert (transport.written, stream.take()) == ([], "c")
    cycle.disconnected = True
    stream.accept_text(3, "d", 4)
    cycle.disconnected = False
    assert (transport.written, stream.take()) == ([], "d")
    stream.accept_text(4, "e", 5)
    assert len(transport.written) == 1 and b'"e"' in transport.written[0] and not stream.has_news


def test_the_last_delta_wakes_the_handler_after_writing_its_text() -> None:
    formatter = CompletionFormatter("cmpl-a", "m", ChunkUsage(True, False))
    stream, writer, _, transport = stream_with_sink(formatter)
    writer.armed = True
    stream.accept(TextDelta("r", 0, "end", 2, finish="length"))
    assert len(transport.written) == 1 and stream.done and stream.wakeup.is_set() and not stream.has_news


def test_only_plain_text_chunks_and_only_uvicorn_httptools_connections_go_direct() -> None:
    rules = StopRules.from_params(DetokParams(), StopLimits())
    plain = RequestStream("r", 3, 1e18, rules)
    parsed = RequestStream("r", 3, 1e18, rules, parsed=True)
    assert ChatFormatter("c", "m", ChunkUsage(False, False)).text_event(0, parsed) is None
    assert MessagesFormatter("c", "m", ChunkUsage(True, False)).text_event(0, parsed) is None
    assert ResponsesFormatter("c", "m", ChunkUsage(True, False)).text_event(0, parsed) is None
    assert ChatFormatter("c", "m", ChunkUsage(True, True)).text_event(0, plain) is None  # running usage
    assert CompletionFormatter("c", "m", ChunkUsage(False, False), logprobs=True).text_event(0, plain) is None

    async def other_send(message: Any) -> None:
        pass

    assert connection_writer({sse.SERVER_SEND: other_send, "method": "POST"}) is None
    assert connection_writer({"method": "POST"}) is None


def test_a_cycle_without_the_fields_the_writer_uses_gets_no_writer() -> None:
    """A uvicorn release that renames the cycle's state the writer reads falls back to the ASGI send."""
    cycle, _ = started_cycle()
    assert connection_writer({sse.SERVER_SEND: cycle.send, "method": "POST"}) is not None
    del cycle.chunked_encoding
    assert connection_writer({sse.SERVER_SEND: cycle.send, "method": "POST"}) is None


def test_a_held_head_leaves_with_the_first_events_in_one_write() -> None:
    cycle, transport = started_cycle()
    cycle.response_started = False  # a fresh response: its head is still to be sent
    writer = connection_writer({sse.SERVER_SEND: cycle.send, "method": "POST"})
    assert writer is not None
    writer.hold()

    async def respond() -> None:
        await cycle.send({"type": "http.response.start", "status": 200, "headers": sse.RAW_HEADERS})
        await cycle.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})

    asyncio.run(respond())
    assert transport.written == []
    writer.arm()  # the handler is about to wait: what is held goes out, once
    assert len(transport.written) == 1 and transport.written[0].startswith(b"HTTP/1.1 200")
    assert transport.written[0].endswith(b"data: 1\n\n\r\n") and writer.armed
    writer.release()
    assert len(transport.written) == 1


def test_a_close_while_held_writes_what_was_held_first() -> None:
    cycle, transport = started_cycle()
    closed: list[bool] = []
    transport.close = lambda: closed.append(bool(transport.written))  # type: ignore[attr-defined]
    writer = connection_writer({sse.SERVER_SEND: cycle.send, "method": "POST"})
    assert writer is not None
    writer.hold()
    cycle.keep_alive = False  # uvicorn closes the connection after the last body message
    asyncio.run(cycle.send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}))
    assert closed == [True] and transport.written[0].endswith(b"0\r\n\r\n")
