"""The pre-encoded text chunks are byte for byte what encoding the whole chunk gives."""

from __future__ import annotations

import pytest

from detok_worker.front.openai_api import ChatChunkChoice, ChatDelta, CompletionChoice
from detok_worker.front.responses import ChatFormatter, CompletionFormatter

TEXTS = ["plain", "", 'quote " backslash \\ newline \n nul \x00 tab \t', "é 中文 🙂", "\u2028\u2029"]


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_completion_text_chunk_equals_the_whole_encode(include_usage: bool, text: str) -> None:
    formatter = CompletionFormatter("cmpl-abc", "model-x", include_usage)
    assert formatter.text_chunk(text) == formatter._chunk(CompletionChoice(0, text))


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_chat_text_chunk_equals_the_whole_encode(include_usage: bool, text: str) -> None:
    formatter = ChatFormatter("chatcmpl-abc", "model-x", include_usage)
    assert formatter.text_chunk(text) == formatter._chunk(ChatChunkChoice(0, ChatDelta(content=text)))
