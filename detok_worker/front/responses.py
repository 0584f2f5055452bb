"""Response bodies and streamed chunks for the two generation endpoints, from a finished or live RequestStream."""

from __future__ import annotations

import time
import uuid

import msgspec

from detok_worker.bus.messages import LogprobText
from detok_worker.front.openai_api import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    FunctionCallOut,
    TokenLogprobOut,
    ToolCallOut,
    TopLogprobOut,
    Usage,
)
from detok_worker.front.request_stream import RequestStream
from detok_worker.parse.base import ParsedOutput

FINISH_TOOL_CALLS = "tool_calls"

_encode = msgspec.json.encode
_TEXT_MARK = "\x00detok-text\x00"  # encodes as "\u0000detok-text\u0000": never part of the rest of a chunk


class ChunkTemplate:
    """A text chunk pre-encoded around its text: per chunk only the text is encoded (same bytes as encoding
    the whole chunk)."""

    def __init__(self, encoded_with_mark: bytes) -> None:
        self._prefix, self._suffix = encoded_with_mark.split(_encode(_TEXT_MARK))

    def fill(self, text: str) -> bytes:
        return self._prefix + _encode(text) + self._suffix


def usage_of(stream: RequestStream) -> Usage:
    return Usage(stream.prompt_tokens, stream.n_tokens, stream.prompt_tokens + stream.n_tokens)


def _logprob_value(value: float) -> float | None:
    return None if value != value else value  # NaN: an entry the engine did not give


def chat_logprobs(entries: list[LogprobText]) -> ChatLogprobs:
    """choices[].logprobs of chat: per token its string, logprob, bytes and top candidates."""
    return ChatLogprobs(
        [
            TokenLogprobOut(
                entry.token,
                _logprob_value(entry.logprob),
                list(entry.token_bytes),
                [TopLogprobOut(top.token, _logprob_value(top.logprob), list(top.token_bytes)) for top in entry.top],
            )
            for entry in entries
        ]
    )


class CompletionLogprobsBuilder:
    """choices[].logprobs of completions (the legacy shape); keeps text_offset running across a stream."""

    def __init__(self) -> None:
        self.text_offset = 0

    def build(self, entries: list[LogprobText]) -> CompletionLogprobs:
        offsets = []
        for entry in entries:
            offsets.append(self.text_offset)
            self.text_offset += len(entry.token)
        return CompletionLogprobs(
            tokens=[entry.token for entry in entries],
            token_logprobs=[_logprob_value(entry.logprob) for entry in entries],
            top_logprobs=[{top.token: top.logprob for top in entry.top} for entry in entries],
            text_offset=offsets,
        )


class CompletionFormatter:
    """/v1/completions: `text_completion` objects, streamed or whole."""

    def __init__(self, rid: str, model: str, include_usage: bool, logprobs: bool = False) -> None:
        self.rid = rid
        self.model = model
        self.created = int(time.time())
        self._logprobs = CompletionLogprobsBuilder() if logprobs else None
        # OpenAI: with include_usage every chunk carries "usage": null, and one last chunk the totals
        self._usage: None | msgspec.UnsetType = None if include_usage else msgspec.UNSET
        self._text_template = ChunkTemplate(self._chunk(CompletionChoice(0, _TEXT_MARK)))

    def _chunk(self, choice: CompletionChoice) -> bytes:
        return _encode(CompletionResponse(self.rid, self.created, self.model, [choice], usage=self._usage))

    def first_chunk(self) -> bytes | None:
        return None

    def text_chunk(self, text: str | ParsedOutput, logprobs: list[LogprobText] | None = None) -> bytes:
        assert isinstance(text, str)  # completions have no parsers
        if self._logprobs is None:
            return self._text_template.fill(text)
        return self._chunk(CompletionChoice(0, text, logprobs=self._logprobs_of(logprobs)))

    def _logprobs_of(self, entries: list[LogprobText] | None) -> CompletionLogprobs | None:
        return None if self._logprobs is None else self._logprobs.build(entries or [])

    def final_chunk(self, stream: RequestStream) -> bytes:
        return self._chunk(CompletionChoice(0, "", stream.finish, stream.stop_reason))

    def usage_chunk(self, stream: RequestStream) -> bytes:
        return _encode(CompletionResponse(self.rid, self.created, self.model, [], usage=usage_of(stream)))

    def whole(
        self, pieces: list[str | ParsedOutput], stream: RequestStream, logprobs: list[LogprobText] | None = None
    ) -> bytes:
        text = "".join(piece for piece in pieces if isinstance(piece, str))
        choice = CompletionChoice(0, text, stream.finish, stream.stop_reason, self._logprobs_of(logprobs))
        return _encode(CompletionResponse(self.rid, self.created, self.model, [choice], usage=usage_of(stream)))


class ChatFormatter:
    """/v1/chat/completions: `chat.completion(.chunk)` objects; the first chunk carries the role."""

    def __init__(self, rid: str, model: str, include_usage: bool, logprobs: bool = False) -> None:
        self.rid = rid
        self.model = model
        self.created = int(time.time())
        self._usage: None | msgspec.UnsetType = None if include_usage else msgspec.UNSET
        self._with_logprobs = logprobs
        self._tool_call_ids: dict[int, str] = {}  # tool call index -> its id (made here: the worker has none)
        self._text_template = ChunkTemplate(self._chunk(ChatChunkChoice(0, ChatDelta(content=_TEXT_MARK))))

    def _tool_call_id(self, index: int) -> str:
        if index not in self._tool_call_ids:
            self._tool_call_ids[index] = f"chatcmpl-tool-{uuid.uuid4().hex}"
        return self._tool_call_ids[index]

    def _chunk(self, choice: ChatChunkChoice) -> bytes:
        return _encode(ChatCompletionChunk(self.rid, self.created, self.model, [choice], usage=self._usage))

    def first_chunk(self) -> bytes | None:
        return self._chunk(ChatChunkChoice(0, ChatDelta(role="assistant", content="")))

    def _logprobs_of(self, entries: list[LogprobText] | None) -> ChatLogprobs | None:
        return chat_logprobs(entries or []) if self._with_logprobs else None

    def text_chunk(self, text: str | ParsedOutput, logprobs: list[LogprobText] | None = None) -> bytes:
        if isinstance(text, str) and not self._with_logprobs:
            return self._text_template.fill(text)
        chosen = self._logprobs_of(logprobs)
        if isinstance(text, str):
            return self._chunk(ChatChunkChoice(0, ChatDelta(content=text), logprobs=chosen))
        delta = ChatDelta()
        if text.reasoning:
            delta.reasoning_content = text.reasoning
        if text.content:
            delta.content = text.content
        if text.tool_calls:
            delta.tool_calls = [
                self._tool_call_piece(piece.index, piece.name, piece.arguments) for piece in text.tool_calls
            ]
        return self._chunk(ChatChunkChoice(0, delta, logprobs=chosen))

    def _tool_call_piece(self, index: int, name: str, arguments: str) -> ToolCallOut:
        if not name:
            return ToolCallOut(FunctionCallOut(arguments=arguments), index=index)
        return ToolCallOut(FunctionCallOut(name, arguments), index, self._tool_call_id(index), "function")

    def final_chunk(self, stream: RequestStream) -> bytes:
        return self._chunk(ChatChunkChoice(0, ChatDelta(), _finish_reason(stream), stream.stop_reason))

    def usage_chunk(self, stream: RequestStream) -> bytes:
        return _encode(ChatCompletionChunk(self.rid, self.created, self.model, [], usage=usage_of(stream)))

    def whole(
        self, pieces: list[str | ParsedOutput], stream: RequestStream, logprobs: list[LogprobText] | None = None
    ) -> bytes:
        message = self._message(pieces, stream)
        choice = ChatChoice(0, message, _finish_reason(stream), stream.stop_reason, self._logprobs_of(logprobs))
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
