"""Response bodies and streamed chunks for the two generation endpoints, from a finished or live RequestStream."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from detok_worker.bus.messages import LogprobText
from detok_worker.front import sse
from detok_worker.front.choices import Choices
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
    CompletionTokensDetails,
    FunctionCallOut,
    PromptLogprobsOut,
    TokenLogprobOut,
    ToolCallOut,
    TopLogprobOut,
    Usage,
)
from detok_worker.front.prompt_logprobs import after_echo, echo_end
from detok_worker.front.request_stream import RequestStream
from detok_worker.parse.base import ParsedOutput, ToolCallPiece
from detok_worker.parse.registry import NAMED_CALL, REQUIRED_CALLS

FINISH_TOOL_CALLS = "tool_calls"

_encode = msgspec.json.encode
News = str | ParsedOutput  # a choice's news: text, or a parsed request's channels
Entries = list[LogprobText] | None
Ids = list[int] | None
TEXT_MARK = "\x00detok-text\x00"  # encodes as "\u0000detok-text\u0000": never part of the rest of a chunk
NUMBER_MARK = "\x00detok-number\x00"  # where a numbered event's number goes (a Responses sequence_number)


class ChunkTemplate:
    """A text chunk pre-encoded around its text (and its number, where it has NUMBER_MARK before the text): per
    chunk only those are encoded (same bytes as encoding the whole chunk)."""

    def __init__(self, encoded_with_mark: bytes) -> None:
        self.prefix, self.suffix = encoded_with_mark.split(_encode(TEXT_MARK))
        self.head, _, self.middle = self.prefix.partition(_encode(NUMBER_MARK))

    def fill(self, text: str) -> bytes:
        return self.prefix + _encode(text) + self.suffix

    def fill_numbered(self, text: str, number: int) -> bytes:
        return self.head + str(number).encode() + self.middle + _encode(text) + self.suffix


def usage_of(stream: RequestStream, reasoning: bool = False, started: bool = True) -> Usage:
    """One choice's running usage (vLLM's continuous_usage_stats: per choice); `reasoning`: with its reasoning
    tokens; not `started`: before its output (no completion tokens yet)."""
    n_tokens = stream.n_tokens if started else 0
    usage = Usage(stream.prompt_tokens, n_tokens, stream.prompt_tokens + n_tokens)
    if reasoning:
        usage.completion_tokens_details = CompletionTokensDetails(stream.reasoning_tokens if started else 0)
    return usage


def _logprob_value(value: float) -> float | None:
    return None if value != value else value  # NaN: an entry the engine did not give


def token_id_placeholder(entry: LogprobText) -> str:
    """vLLM's string for a token given as its id (return_tokens_as_token_ids)."""
    return f"token_id:{entry.token_id}"


def chat_logprobs(entries: list[LogprobText], as_ids: bool = False) -> ChatLogprobs:
    """choices[].logprobs of chat: per token its string, logprob, bytes and top candidates. `as_ids`
    (return_tokens_as_token_ids): each string is "token_id:<id>"; the sampled token keeps its own bytes, a
    candidate's are its string's (vLLM's)."""
    token = token_id_placeholder if as_ids else _token_string
    candidate = _top_as_id if as_ids else _top_as_text
    return ChatLogprobs(
        [
            TokenLogprobOut(
                token(entry),
                _logprob_value(entry.logprob),
                list(entry.token_bytes),
                [candidate(top) for top in entry.top],
            )
            for entry in entries
        ]
    )


def _top_as_text(top: LogprobText) -> TopLogprobOut:
    return TopLogprobOut(top.token, _logprob_value(top.logprob), list(top.token_bytes))


def _top_as_id(top: LogprobText) -> TopLogprobOut:
    token = token_id_placeholder(top)
    return TopLogprobOut(token, _logprob_value(top.logprob), list(token.encode()))


def _completion_top(entry: LogprobText, token: Callable[[LogprobText], str]) -> dict[str, float]:
    """A completion token's top_logprobs: the sampled token first, then the top candidates, most likely first (OpenAI's
    legacy shape, as vLLM gives it: up to logprobs + 1 entries; a token string that two ids share keeps the later
    one's value)."""
    top = {token(entry): entry.logprob}
    for candidate in entry.top:
        top[token(candidate)] = candidate.logprob
    return top


def _token_string(entry: LogprobText) -> str:
    return entry.token


class CompletionLogprobsBuilder:
    """choices[].logprobs of completions (the legacy shape); keeps text_offset running across a stream. `as_ids`
    (return_tokens_as_token_ids): each token string is "token_id:<id>", and the offsets count those (vLLM's)."""

    def __init__(self, as_ids: bool = False, text_offset: int = 0) -> None:
        self.text_offset = text_offset
        self._token = token_id_placeholder if as_ids else _token_string

    def build(self, entries: list[LogprobText]) -> CompletionLogprobs:
        offsets = []
        tokens = [self._token(entry) for entry in entries]
        for token in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        return CompletionLogprobs(
            tokens=tokens,
            token_logprobs=[_logprob_value(entry.logprob) for entry in entries],
            top_logprobs=[_completion_top(entry, self._token) for entry in entries],
            text_offset=offsets,
        )


class ChunkUsage:
    """What a streamed chunk carries as `usage`: absent; null (include_usage: OpenAI puts "usage": null on
    every chunk and the totals on one last chunk); or (continuous_usage_stats) the choice's running counts.
    `reasoning`: usage with the reasoning tokens (a chat answer, front.reasoning_tokens_details)."""

    def __init__(self, include_usage: bool, continuous: bool, reasoning: bool = False) -> None:
        self.include_usage = include_usage
        self.continuous = continuous
        self.reasoning = reasoning
        self._fixed: None | msgspec.UnsetType = None if include_usage else msgspec.UNSET

    def of(self, stream: RequestStream, started: bool = True) -> Usage | None | msgspec.UnsetType:
        """`started` false: a chunk that comes before the choice's output (a chat's role and echo chunks, which
        vLLM's server sends before any id), whose running usage counts no completion tokens."""
        return usage_of(stream, self.reasoning, started) if self.continuous else self._fixed


class TokenIds:
    """return_token_ids (vLLM's): the prompt's ids, and which choices' streams have shown them (their first chunk)."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids = prompt_ids
        self._shown: set[int] = set()

    def prompt_once(self, index: int) -> list[int] | msgspec.UnsetType:
        """The prompt's ids for choice `index`'s first chunk; UNSET on its later chunks."""
        if index in self._shown:
            return msgspec.UNSET
        self._shown.add(index)
        return self.prompt_ids


@dataclass(slots=True)
class Collected:
    """A whole answer's parts per choice (its news, logprob entries and output ids), and the prompt's logprobs
    (vLLM's, when asked)."""

    pieces: list[list[News]]
    logprobs: list[list[LogprobText]]
    token_ids: list[list[int]]
    prompt_logprobs: PromptLogprobsOut | None = None


class FormatterBase:
    """What both endpoints' formatters keep: the response's id, model and creation time, the engine's
    system_fingerprint, and the request's output options (usage in chunks, echo, logprobs, return_token_ids).
    Their chunks are OpenAI's `data:` events (`framing`).

    The fingerprint goes where vLLM's server writes it: on a whole body, on the usage chunk, and (without
    include_usage) on each choice's last chunk."""

    framing = sse.OPENAI_FRAMING

    def __init__(
        self,
        rid: str,
        model: str,
        usage: ChunkUsage,
        echo: str | None = None,
        logprobs: bool = False,
        token_ids: TokenIds | None = None,
        fingerprint: str = "",
        tokens_as_ids: bool = False,
    ) -> None:
        self.rid = rid
        self.model = model
        self.created = int(time.time())
        self._usage = usage
        self.include_usage = usage.include_usage  # the stream ends with a usage chunk
        self._echo = echo
        self._with_logprobs = logprobs
        self.token_ids = token_ids
        self.tokens_as_ids = tokens_as_ids  # logprob tokens as "token_id:<id>" (return_tokens_as_token_ids)
        self.fingerprint: str | msgspec.UnsetType = fingerprint or msgspec.UNSET
        # on the last chunk of each choice, unless a usage chunk ends the stream
        self._last_fingerprint = msgspec.UNSET if self.include_usage else self.fingerprint
        # a plain text chunk has nothing per chunk but its text: it is filled into a template
        self._templated = not logprobs and not usage.continuous and token_ids is None
        self._text_templates: dict[int, ChunkTemplate] = {}  # by choice index, made on first use

    def text_chunk(
        self, index: int, text: News, stream: RequestStream, logprobs: Entries = None, token_ids: Ids = None
    ) -> bytes:
        """A chunk of a choice's news, with the logprob entries and output ids that came with it."""
        if self._templated and isinstance(text, str):
            return self._text_template(index, stream).fill(text)
        return self._text_chunk(index, text, stream, logprobs, token_ids)

    def text_event(self, index: int, stream: RequestStream) -> Callable[[str], bytes] | None:
        """What makes choice `index`'s SSE event(s) of a piece of text when its chunks carry nothing but plain text (no
        parsers, logprobs, token ids or running usage), else None: for edge.EventSink, the same bytes and formatter
        state as the handler's `framing.event(text_chunk(...))`."""
        if not self._templated or stream.parsed_reassembly is not None:
            return None
        return self._plain_text_event(index, stream)

    def _plain_text_event(self, index: int, stream: RequestStream) -> Callable[[str], bytes]:
        return ChunkTemplate(self.framing.event(self._text_chunk_with_mark(index, stream))).fill

    def _text_template(self, index: int, stream: RequestStream) -> ChunkTemplate:
        """Choice `index`'s text chunk around its text: only for chunks whose other fields do not change."""
        template = self._text_templates.get(index)
        if template is None:
            template = self._text_templates[index] = ChunkTemplate(self._text_chunk_with_mark(index, stream))
        return template

    def _text_chunk(self, index: int, text: News, stream: RequestStream, logprobs: Entries, token_ids: Ids) -> bytes:
        raise NotImplementedError

    def _text_chunk_with_mark(self, index: int, stream: RequestStream) -> bytes:
        raise NotImplementedError


class CompletionFormatter(FormatterBase):
    """/v1/completions: `text_completion` objects, streamed or whole. With echo each choice's text starts with
    the prompt (streamed: in the choice's first chunk), and its logprobs with `echoed_logprobs` when the engine
    scored the prompt (prompt_logprobs.echo_logprobs; streamed: on the first chunk). With `token_ids`
    (return_token_ids) each choice carries its output ids and the prompt's (streamed: its chunks' ids, the prompt's
    on its first chunk)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # per choice: text_offset runs across that choice's chunks
        self._logprobs: dict[int, CompletionLogprobsBuilder] | None = {} if self._with_logprobs else None
        self.echoed_logprobs: CompletionLogprobs | None = None

    def _chunk(self, choice: CompletionChoice, stream: RequestStream) -> bytes:
        usage = self._usage.of(stream)
        chunk = CompletionResponse(self.rid, self.created, self.model, [choice], usage=usage)
        if choice.finish_reason is not None:
            chunk.system_fingerprint = self._last_fingerprint
        return _encode(chunk)

    def _with_ids(self, choice: CompletionChoice, token_ids: list[int] | None) -> CompletionChoice:
        if self.token_ids is not None:
            choice.token_ids = token_ids or []
            choice.prompt_token_ids = self.token_ids.prompt_once(choice.index)
        return choice

    def first_chunks(self, index: int, stream: RequestStream) -> list[bytes]:
        if self._echo is None:
            return []
        choice = CompletionChoice(index, self._echo)
        echoed = self.echoed_logprobs
        if echoed is not None and self._logprobs is not None:  # the prompt's logprobs, then the output's after them
            choice.logprobs = echoed
            self._logprobs[index] = CompletionLogprobsBuilder(self.tokens_as_ids, echo_end(echoed))
        return [self._chunk(self._with_ids(choice, None), stream)]

    def _text_chunk_with_mark(self, index: int, stream: RequestStream) -> bytes:
        return self._chunk(CompletionChoice(index, TEXT_MARK), stream)

    def _text_chunk(self, index: int, text: News, stream: RequestStream, logprobs: Entries, token_ids: Ids) -> bytes:
        assert isinstance(text, str)  # completions have no parsers
        choice = CompletionChoice(index, text, logprobs=self._logprobs_of(index, logprobs))
        return self._chunk(self._with_ids(choice, token_ids), stream)

    def _logprobs_of(self, index: int, entries: list[LogprobText] | None) -> CompletionLogprobs | None:
        if self._logprobs is None:
            return None
        return self._logprobs.setdefault(index, CompletionLogprobsBuilder(self.tokens_as_ids)).build(entries or [])

    def final_chunk(self, index: int, stream: RequestStream) -> bytes:
        return self._chunk(self._with_ids(CompletionChoice(index, "", stream.finish, stream.stop_reason), None), stream)

    def usage_chunk(self, choices: Choices) -> bytes:
        usage = choices.usage()
        return _encode(
            CompletionResponse(self.rid, self.created, self.model, [], usage, system_fingerprint=self.fingerprint)
        )

    def whole(self, collected: Collected, choices: Choices) -> bytes:
        """The whole body; the prompt logprobs go on every choice (one prompt), as vLLM's."""
        out = []
        for index, stream in enumerate(choices.streams):
            text = (self._echo or "") + "".join(piece for piece in collected.pieces[index] if isinstance(piece, str))
            entries = self._logprobs_of(index, collected.logprobs[index])
            if self.echoed_logprobs is not None and entries is not None:
                entries = after_echo(self.echoed_logprobs, entries)
            choice = CompletionChoice(index, text, stream.finish, stream.stop_reason, entries)
            if collected.prompt_logprobs is not None:
                choice.prompt_logprobs = collected.prompt_logprobs
            out.append(self._with_ids(choice, collected.token_ids[index]))
        response = CompletionResponse(self.rid, self.created, self.model, out, choices.usage())
        response.system_fingerprint = self.fingerprint
        return _encode(response)


class ChatFormatter(FormatterBase):
    """/v1/chat/completions: `chat.completion(.chunk)` objects; each choice's first chunk carries the role (and with
    `token_ids`, return_token_ids, the prompt's ids: vLLM puts them on the response, and each choice's output ids on
    the choice; streamed, each chunk's output ids)."""

    call_id_prefix = "chatcmpl-tool-"  # a tool call's id: this and a uuid (when the model wrote none)

    def __init__(
        self,
        *args: Any,
        reasoning_field: str = "reasoning_content",
        forced_calls: str = "",
        parallel_tool_calls: bool = True,
        role: str = "assistant",
        prompt_text: str | None = None,
        **kwargs: Any,
    ) -> None:
        """`reasoning_field`: the field that carries the reasoning ("reasoning_content", or vLLM 0.32's "reasoning";
        "" = none: the request asked include_reasoning false). `forced_calls`: the stage of a tool_choice that forces
        calls (REQUIRED_CALLS, NAMED_CALL; front/parsing.py), shaped as vLLM's server shapes them: the message's
        content "" and (required) each call's arguments its parameters as JSON, and a named call ends with its own
        finish reason. `parallel_tool_calls` false: the first call only (vLLM's filter). `role`: the answer's role.
        `prompt_text` (return_prompt_text): the rendered prompt, on the whole answer and each choice's first chunk."""
        super().__init__(*args, **kwargs)
        self.reasoning_field = reasoning_field
        self.forced_calls = forced_calls
        self.parallel_tool_calls = parallel_tool_calls
        self.role = role
        self.prompt_text = msgspec.UNSET if prompt_text is None else prompt_text
        # (choice, tool call index) -> the call's id
        self._tool_call_ids: dict[tuple[int, int], str] = {}

    def _tool_call_id(self, choice: int, index: int, model_id: str = "") -> str:
        """The call's id: the one the model wrote (`model_id`, as vLLM's server takes it in every API), else one
        made for it."""
        if (choice, index) not in self._tool_call_ids:
            self._tool_call_ids[choice, index] = model_id or f"{self.call_id_prefix}{uuid.uuid4().hex}"
        return self._tool_call_ids[choice, index]

    def _chunk(
        self, choice: ChatChunkChoice, stream: RequestStream, first: bool = False, before_output: bool = False
    ) -> bytes:
        """`first`: the choice's first chunk (with the rendered prompt, return_prompt_text); `before_output`: a chunk
        that comes before the choice's output (its usage counts none of it)."""
        usage = self._usage.of(stream, started=not before_output)
        chunk = ChatCompletionChunk(self.rid, self.created, self.model, [choice], usage=usage)
        if first:
            chunk.prompt_text = self.prompt_text
        if choice.finish_reason is not None:
            chunk.system_fingerprint = self._last_fingerprint
        if self.token_ids is not None:
            chunk.prompt_token_ids = self.token_ids.prompt_once(choice.index)
        return _encode(chunk)

    def first_chunks(self, index: int, stream: RequestStream) -> list[bytes]:
        """The role, then (echo) the last message's content, as vLLM's server sends them."""
        role = ChatChunkChoice(index, ChatDelta(role=self.role, content=""))
        chunks = [self._chunk(role, stream, first=True, before_output=True)]
        if self._echo:
            echo = ChatChunkChoice(index, ChatDelta(content=self._echo))
            chunks.append(self._chunk(echo, stream, before_output=True))
        return chunks

    def _ids_of(self, token_ids: list[int] | None) -> list[int] | msgspec.UnsetType:
        return msgspec.UNSET if self.token_ids is None else token_ids or []

    def _logprobs_of(self, entries: list[LogprobText] | None) -> ChatLogprobs | None:
        return chat_logprobs(entries or [], self.tokens_as_ids) if self._with_logprobs else None

    def _text_chunk_with_mark(self, index: int, stream: RequestStream) -> bytes:
        return self._chunk(ChatChunkChoice(index, ChatDelta(content=TEXT_MARK)), stream)

    def _text_chunk(self, index: int, text: News, stream: RequestStream, logprobs: Entries, token_ids: Ids) -> bytes:
        chosen = self._logprobs_of(logprobs)
        ids = self._ids_of(token_ids)
        if isinstance(text, str):
            return self._chunk(ChatChunkChoice(index, ChatDelta(content=text), logprobs=chosen, token_ids=ids), stream)
        delta = ChatDelta()
        if text.reasoning and self.reasoning_field:
            setattr(delta, self.reasoning_field, text.reasoning)
        if text.content:
            delta.content = text.content
        pieces = self._kept(text.tool_calls)
        if pieces:
            delta.tool_calls = [
                self._tool_call_piece(index, piece.index, piece.name, piece.arguments, piece.id) for piece in pieces
            ]
        return self._chunk(ChatChunkChoice(index, delta, logprobs=chosen, token_ids=ids), stream)

    def _tool_call_piece(self, choice: int, index: int, name: str, arguments: str, model_id: str) -> ToolCallOut:
        if not name:
            return ToolCallOut(FunctionCallOut(arguments=arguments), index=index)
        call_id = self._tool_call_id(choice, index, model_id)
        return ToolCallOut(FunctionCallOut(name, arguments), index, call_id, "function")

    def _whole_arguments(self, arguments: str) -> str:
        """A call's arguments in a whole answer: as written, but for tool_choice "required", whose parameters vLLM's
        server writes back as JSON (`json.dumps`, non-ASCII kept) when they parse."""
        if self.forced_calls != REQUIRED_CALLS:
            return arguments
        try:
            return json.dumps(json.loads(arguments), ensure_ascii=False)
        except ValueError:
            return arguments

    def _finish_reason(self, stream: RequestStream) -> str | None:
        """OpenAI's "tool_calls" when the model ended (EOS, a stop) after calling tools, but for a named call."""
        if stream.tool_calls_seen and stream.finish == "stop" and self.forced_calls != NAMED_CALL:
            return FINISH_TOOL_CALLS
        return stream.finish

    def final_chunk(self, index: int, stream: RequestStream) -> bytes:
        finish = self._finish_reason(stream)
        choice = ChatChunkChoice(index, ChatDelta(), finish, stream.stop_reason, token_ids=self._ids_of(None))
        return self._chunk(choice, stream)

    def usage_chunk(self, choices: Choices) -> bytes:
        usage = choices.usage(created=True, reasoning=self._usage.reasoning)
        return _encode(
            ChatCompletionChunk(self.rid, self.created, self.model, [], usage, system_fingerprint=self.fingerprint)
        )

    def whole(self, collected: Collected, choices: Choices) -> bytes:
        """The whole body; the prompt logprobs on the response, as vLLM's."""
        out = [
            ChatChoice(
                index,
                self._message(index, collected.pieces[index], stream),
                self._finish_reason(stream),
                stream.stop_reason,
                self._logprobs_of(collected.logprobs[index]),
                self._ids_of(collected.token_ids[index]),
            )
            for index, stream in enumerate(choices.streams)
        ]
        usage = choices.usage(created=True, reasoning=self._usage.reasoning)
        response = ChatCompletionResponse(self.rid, self.created, self.model, out, usage)
        response.system_fingerprint = self.fingerprint
        response.prompt_text = self.prompt_text
        if self.token_ids is not None:
            response.prompt_token_ids = self.token_ids.prompt_ids
        if collected.prompt_logprobs is not None:
            response.prompt_logprobs = collected.prompt_logprobs
        return _encode(response)

    def _kept(self, calls: list[ToolCallPiece]) -> list[ToolCallPiece]:
        """The tool calls (or pieces of them) an answer shows: the first only without parallel_tool_calls."""
        return calls if self.parallel_tool_calls else [call for call in calls if call.index == 0]

    def _whole_calls(self, choice: int, pieces: list[News]) -> tuple[ParsedOutput, list[tuple[str, str, str]]]:
        """A whole answer's channels summed (plain text as content), and (id, name, arguments) of each call shown."""
        total = ParsedOutput()
        for piece in pieces:
            total.extend(ParsedOutput(content=piece) if isinstance(piece, str) else piece)
        calls = [
            (self._tool_call_id(choice, call.index, call.id), call.name, self._whole_arguments(call.arguments))
            for call in self._kept(total.tool_calls)
        ]
        return total, calls

    def _message(self, choice: int, pieces: list[News], stream: RequestStream) -> ChatMessageOut:
        if stream.parsed_reassembly is None:
            return ChatMessageOut((self._echo or "") + "".join(p for p in pieces if isinstance(p, str)), self.role)
        total, calls = self._whole_calls(choice, pieces)
        content = (self._echo or "") + total.content if self._echo or total.content else None
        if content is None and self.forced_calls:
            content = ""
        shown = [
            ToolCallOut(FunctionCallOut(name, arguments), id=call_id, type="function")
            for call_id, name, arguments in calls
        ]
        message = ChatMessageOut(content, self.role, tool_calls=shown)
        if self.reasoning_field:
            setattr(message, self.reasoning_field, total.reasoning or None)
        return message


REASONING, TEXT, TOOL_CALL = "reasoning", "text", "tool_call"  # the kinds of a BlockFormatter's blocks
Block = tuple[str, str, str, str]  # a whole answer's block: (kind, text or arguments, tool name, tool call id)


class BlockFormatter(ChatFormatter):
    """The answer of one chat choice in another API's shape (Anthropic's Messages, OpenAI's Responses): a list of
    blocks, the reasoning, the text and one per tool call. Streamed, a block opens when the output moves to another
    channel or tool call and closes before the next opens; a subclass writes the events of each step (`_opened`,
    `_delta_event`, `_closed`: whole events, its `framing` adds nothing) and the whole answer (`_answer`)."""

    call_id_prefix = "call_"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.block = ""  # the open block's kind ("" = none)
        self.blocks = 0  # blocks opened so far (the open one is the last)
        self.block_pieces: list[str] = []  # the open block's text (its arguments, for a tool call) so far
        self.arguments: dict[int, str] = {}  # each streamed tool call's arguments so far
        self._call = -1  # the tool call index of the open tool call block
        self._delta: ChunkTemplate | None = None  # the open block's delta event around its text (`_delta_event`)

    def _plain_text_event(self, index: int, stream: RequestStream) -> Callable[[str], bytes]:
        """Its own step (its framing adds nothing): the first text opens the text block, the rest is its deltas."""

        def event(text: str) -> bytes:
            return self._add(TEXT, text) if self.block == TEXT else self.text_chunk(index, text, stream)

        return event

    def _opened(self, kind: str, name: str, call_id: str) -> list[bytes]:
        raise NotImplementedError

    def _delta_event(self, kind: str, text: str, number: str) -> bytes:
        """The open block's delta event of `text` (numbered `number` where its events are): made once per block with
        the marks, a template that each delta fills (`_filled`)."""
        raise NotImplementedError

    def _filled(self, template: ChunkTemplate, text: str) -> bytes:
        return template.fill(text)

    def _closed(self, kind: str) -> list[bytes]:
        raise NotImplementedError

    def _answer(self, stream: RequestStream, blocks: list[Block]) -> bytes:
        """The whole answer from its blocks: the reasoning, the text (each when there is some), each tool call."""
        raise NotImplementedError

    def _open(self, kind: str, name: str = "", call_id: str = "") -> list[bytes]:
        events = self._close()
        self.block, self.block_pieces, self._delta = kind, [], None
        self.blocks += 1
        return [*events, *self._opened(kind, name, call_id)]

    def _close(self) -> list[bytes]:
        if not self.block:
            return []
        events = self._closed(self.block)
        self.block = ""
        return events

    def _add(self, kind: str, text: str) -> bytes:
        self.block_pieces.append(text)  # joined once, at its close: a += on an attribute copies the whole text
        template = self._delta
        if template is None:
            template = self._delta = ChunkTemplate(self._delta_event(kind, TEXT_MARK, NUMBER_MARK))
        return self._filled(template, text)

    def text_chunk(
        self, index: int, text: News, stream: RequestStream, logprobs: Entries = None, token_ids: Ids = None
    ) -> bytes:
        """The events of a choice's news: each block's deltas, after the events that open it (never a chat chunk)."""
        events: list[bytes] = []
        parsed = ParsedOutput(content=text) if isinstance(text, str) else text
        for kind, news in ((REASONING, self._reasoning(parsed)), (TEXT, parsed.content)):
            if news:
                if self.block != kind:
                    events += self._open(kind)
                events.append(self._add(kind, news))
        for piece in self._kept(parsed.tool_calls):
            if piece.name:
                events += self._open(TOOL_CALL, piece.name, self._tool_call_id(index, piece.index, piece.id))
                self._call = piece.index
            self.arguments[piece.index] = self.arguments.get(piece.index, "") + piece.arguments
            if piece.arguments and self.block == TOOL_CALL and self._call == piece.index:
                events.append(self._add(TOOL_CALL, piece.arguments))
        return b"".join(events)

    def final_chunk(self, index: int, stream: RequestStream) -> bytes:
        return b"".join(self._close())

    def _reasoning(self, parsed: ParsedOutput) -> str:
        """The reasoning the answer shows (none when the request asked include_reasoning false)."""
        return parsed.reasoning if self.reasoning_field else ""

    def whole(self, collected: Collected, choices: Choices) -> bytes:
        total, calls = self._whole_calls(0, collected.pieces[0])
        blocks = [
            (kind, text, "", "") for kind, text in ((REASONING, self._reasoning(total)), (TEXT, total.content)) if text
        ]
        blocks += [(TOOL_CALL, arguments, name, call_id) for call_id, name, arguments in calls]
        return self._answer(choices.streams[0], blocks)


Formatter = CompletionFormatter | ChatFormatter
