"""Response bodies and streamed chunks for the two generation endpoints, from a finished or live RequestStream."""

from __future__ import annotations

import time
import uuid

import msgspec

from detok_worker.front.openai_api import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatMessageOut,
    CompletionChoice,
    CompletionResponse,
    FunctionCallOut,
    ToolCallOut,
    Usage,
)
from detok_worker.front.request_stream import RequestStream
from detok_worker.parse.base import ParsedOutput

FINISH_TOOL_CALLS = "tool_calls"

_encode = msgspec.json.encode


def usage_of(stream: RequestStream) -> Usage:
    return Usage(stream.prompt_tokens, stream.n_tokens, stream.prompt_tokens + stream.n_tokens)


class CompletionFormatter:
    """/v1/completions: `text_completion` objects, streamed or whole."""

    def __init__(self, rid: str, model: str, include_usage: bool) -> None:
        self.rid = rid
        self.model = model
        self.created = int(time.time())
        # OpenAI: with include_usage every chunk carries "usage": null, and one last chunk the totals
        self._usage: None | msgspec.UnsetType = None if include_usage else msgspec.UNSET

    def _chunk(self, choice: CompletionChoice) -> bytes:
        return _encode(CompletionResponse(self.rid, self.created, self.model, [choice], usage=self._usage))

    def first_chunk(self) -> bytes | None:
        return None

    def text_chunk(self, text: str | ParsedOutput) -> bytes:
        assert isinstance(text, str)  # completions have no parsers
        return self._chunk(CompletionChoice(0, text))

    def final_chunk(self, stream: RequestStream) -> bytes:
        return self._chunk(CompletionChoice(0, "", stream.finish, stream.stop_reason))

    def usage_chunk(self, stream: RequestStream) -> bytes:
        return _encode(CompletionResponse(self.rid, self.created, self.model, [], usage=usage_of(stream)))

    def whole(self, pieces: list[str | ParsedOutput], stream: RequestStream) -> bytes:
        text = "".join(piece for piece in pieces if isinstance(piece, str))
        choice = CompletionChoice(0, text, stream.finish, stream.stop_reason)
        return _encode(CompletionResponse(self.rid, self.created, self.model, [choice], usage=usage_of(stream)))


class ChatFormatter:
    """/v1/chat/completions: `chat.completion(.chunk)` objects; the first chunk carries the role."""

    def __init__(self, rid: str, model: str, include_usage: bool) -> None:
        self.rid = rid
        self.model = model
        self.created = int(time.time())
        self._usage: None | msgspec.UnsetType = None if include_usage else msgspec.UNSET
        self._tool_call_ids: dict[int, str] = {}  # tool call index -> its id (made here: the worker has none)

    def _tool_call_id(self, index: int) -> str:
        if index not in self._tool_call_ids:
            self._tool_call_ids[index] = f"chatcmpl-tool-{uuid.uuid4().hex}"
        return self._tool_call_ids[index]

    def _chunk(self, choice: ChatChunkChoice) -> bytes:
        return _encode(ChatCompletionChunk(self.rid, self.created, self.model, [choice], usage=self._usage))

    def first_chunk(self) -> bytes | None:
        return self._chunk(ChatChunkChoice(0, ChatDelta(role="assistant", content="")))

    def text_chunk(self, text: str | ParsedOutput) -> bytes:
        if isinstance(text, str):
            return self._chunk(ChatChunkChoice(0, ChatDelta(content=text)))
        delta = ChatDelta()
        if text.reasoning:
            delta.reasoning_content = text.reasoning
        if text.content:
            delta.content = text.content
        if text.tool_calls:
            delta.tool_calls = [
                self._tool_call_piece(piece.index, piece.name, piece.arguments) for piece in text.tool_calls
            ]
        return self._chunk(ChatChunkChoice(0, delta))

    def _tool_call_piece(self, index: int, name: str, arguments: str) -> ToolCallOut:
        if not name:
            return ToolCallOut(FunctionCallOut(arguments=arguments), index=index)
        return ToolCallOut(FunctionCallOut(name, arguments), index, self._tool_call_id(index), "function")

    def final_chunk(self, stream: RequestStream) -> bytes:
        return self._chunk(ChatChunkChoice(0, ChatDelta(), _finish_reason(stream), stream.stop_reason))

    def usage_chunk(self, stream: RequestStream) -> bytes:
        return _encode(ChatCompletionChunk(self.rid, self.created, self.model, [], usage=usage_of(stream)))

    def whole(self, pieces: list[str | ParsedOutput], stream: RequestStream) -> bytes:
        choice = ChatChoice(0, self._message(pieces, stream), _finish_reason(stream), stream.stop_reason)
        return _encode(ChatCompletionResponse(self.rid, self.created, self.model, [choice], usage_of(stream)))

    def _message(self, pieces: list[str | ParsedOutput], stream: RequestStream) -> ChatMessageOut:
        if stream.parsed_reassembly is None:
            return ChatMessageOut("".join(piece for piece in pieces if isinstance(piece, str)))
        total = ParsedOutput()
        for piece in pieces:
            if isinstance(piece, ParsedOutput):
                total.extend(piece)
        calls = [
            ToolCallOut(FunctionCallOut(call.name, call.arguments), id=self._tool_call_id(call.index), type="function")
            for call in total.tool_calls
        ]
        return ChatMessageOut(total.content or None, reasoning_content=total.reasoning or None, tool_calls=calls)


def _finish_reason(stream: RequestStream) -> str | None:
    """OpenAI's "tool_calls" when the model ended (EOS, a stop) after calling tools."""
    if stream.tool_calls_seen and stream.finish == "stop":
        return FINISH_TOOL_CALLS
    return stream.finish


Formatter = CompletionFormatter | ChatFormatter
