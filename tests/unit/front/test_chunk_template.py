"""The pre-encoded text chunks are byte for byte what encoding the whole chunk gives (each choice index)."""

from __future__ import annotations

import pytest

from detok_worker.bus.messages import DetokParams
from detok_worker.front.openai_api import ChatChunkChoice, ChatDelta, CompletionChoice
from detok_worker.front.request_stream import RequestStream
from detok_worker.front.responses import ChatFormatter, ChunkUsage, CompletionFormatter
from detok_worker.stream.stop.rules import StopLimits, StopRules

TEXTS = ["plain", "", 'quote " backslash \\ newline \n nul \x00 tab \t', "é 中文 🙂", "\u2028\u2029"]


def _stream() -> RequestStream:
    return RequestStream("r", 3, 1e18, StopRules.from_params(DetokParams(), StopLimits()))


@pytest.mark.parametrize("index", [0, 2])
@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_completion_text_chunk_equals_the_whole_encode(index: int, include_usage: bool, text: str) -> None:
    formatter = CompletionFormatter("cmpl-abc", "model-x", ChunkUsage(include_usage, False))
    stream = _stream()
    formatter.text_chunk(index, "warm the template", stream)
    assert formatter.text_chunk(index, text, stream) == formatter._chunk(CompletionChoice(index, text), stream)


@pytest.mark.parametrize("index", [0, 2])
@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_chat_text_chunk_equals_the_whole_encode(index: int, include_usage: bool, text: str) -> None:
    formatter = ChatFormatter("chatcmpl-abc", "model-x", ChunkUsage(include_usage, False))
    stream = _stream()
    formatter.text_chunk(index, "warm the template", stream)
    expected = formatter._chunk(ChatChunkChoice(index, ChatDelta(content=text)), stream)
    assert formatter.text_chunk(index, text, stream) == expected
