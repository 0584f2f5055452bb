"""One live request as the front sees it: the text its HTTP handler has not taken yet, and how it ended."""

from __future__ import annotations

import asyncio
import time
from dataclasses import InitVar, dataclass, field
from typing import Any, Protocol

from detok_worker.bus.messages import (
    FINISH_ERROR,
    LogprobText,
    ParsedDelta,
    PromptLogprobs,
    TextDelta,
)
from detok_worker.bus.reassembly import GAP_ERROR, DeltaReassembly, ParsedReassembly, TokenEntries
from detok_worker.front.errors import ENGINE_ERROR, APIError, engine_failure
from detok_worker.parse.base import ParsedOutput
from detok_worker.stream.stop.rules import StopRules


class TextSink(Protocol):
    """Where a stream's plain text goes as it arrives when its response can take it at once (edge.EventSink)."""

    def write(self, text: str) -> bool:
        """Send `text` on now if the connection can take it (True); False leaves it to the stream's buffer."""
        ...


@dataclass(slots=True, eq=False)
class RequestStream:
    """One request's text as it arrives, and how it ended. Only the event loop thread touches it.

    With a `sink` (a plain text stream whose response writes from the intake), text goes to the sink while its
    buffer is empty and the sink takes it; the rest is buffered as before and the handler is woken. Without one,
    every delta wakes the handler."""

    rid: str
    prompt_tokens: int
    deadline: float
    stop_rules: StopRules
    parsed: InitVar[bool] = False  # a request with parsers: its news are channels (reasoning, content, tool calls)
    # the n choices of one HTTP request share one event: their handler waits for news from any of them
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    reassembly: DeltaReassembly = field(default_factory=DeltaReassembly, init=False)
    pending_chars: int = field(default=0, init=False)  # accepted but not yet taken by the handler
    n_tokens: int = field(default=0, init=False)
    finish: str | None = field(default=None, init=False)
    stop_reason: str | int | None = field(default=None, init=False)
    failure: APIError | None = field(default=None, init=False)
    done: bool = field(default=False, init=False)
    _pieces: list[str] = field(default_factory=list, init=False)
    _parsed: ParsedOutput | None = field(default=None, init=False)  # a parsed request's news not taken yet
    parsed_reassembly: ParsedReassembly | None = field(default=None, init=False)
    tool_calls_seen: bool = field(default=False, init=False)
    reasoning_tokens: int = field(default=0, init=False)  # as vLLM counts them (ParsedDelta.reasoning_tokens)
    _logprobs: list[LogprobText] = field(default_factory=list, init=False)  # entries not yet taken by the handler
    # how many were accepted (by token index: re-sent ones dropped)
    logprob_entries: TokenEntries = field(default_factory=TokenEntries, init=False)
    _token_ids: list[int] = field(default_factory=list, init=False)  # output ids not taken yet (return_token_ids)
    token_id_entries: TokenEntries = field(default_factory=TokenEntries, init=False)
    # for TTFT and inter-token latency (time.monotonic(); 0.0 = not yet): two clock reads per request
    first_output_at: float = field(default=0.0, init=False)
    first_output_tokens: int = field(default=0, init=False)
    ended_at: float = field(default=0.0, init=False)
    answered: bool = field(default=False, init=False)  # a delta came (from its worker: the request was admitted)
    # the engine refused it at admission (its failure is the response's status)
    refused: bool = field(default=False, init=False)
    sink: TextSink | None = field(default=None, init=False)
    prompt_logprobs: PromptLogprobs | None = field(default=None, init=False)  # from the engine, when asked
    # of the prompt: (held by the engine's prefix cache, written to it by the prefill), with report_cached
    cached_tokens: tuple[int, int] | None = field(default=None, init=False)

    def __post_init__(self, parsed: bool) -> None:
        if parsed:
            self._parsed = ParsedOutput()
            self.parsed_reassembly = ParsedReassembly()

    def accept_text(self, offset: int, text: str, n_tokens: int) -> str | None:
        """`accept` for a plain delta read from a TextBatch's columns (text only), without making a TextDelta."""
        if self._parsed is not None:  # a parsed request's plain text is content: the general path
            return self.accept(TextDelta(self.rid, offset, text, n_tokens))
        self.answered = True
        fresh = self.reassembly.take_text(offset, text)
        if fresh is None:
            self._gap()
            return None
        self._count_tokens(n_tokens)
        if self._take_plain(fresh) or self.sink is None:
            self.wakeup.set()
        return fresh

    def accept(self, delta: TextDelta) -> str | None:
        """Take a delta; returns the text it adds (None on a gap, which fails the stream)."""
        self.answered = True
        text = self.reassembly.take(delta)
        if text is None:
            self._gap()
            return None
        if self._parsed is not None:
            if not self._accept_parsed(delta):
                return None
        else:
            self._take_plain(text)
        n_tokens = delta.n_tokens
        if delta.logprobs and not self._accept_entries(delta.logprobs, n_tokens, self.logprob_entries, self._logprobs):
            return None
        if delta.token_ids and not self._accept_entries(
            delta.token_ids, n_tokens, self.token_id_entries, self._token_ids
        ):
            return None
        self._count_tokens(n_tokens)
        if delta.finish is not None:
            self.ended_at = time.monotonic()
            if delta.finish == FINISH_ERROR:
                message = delta.error or "the detokenizer failed on this request"
                if delta.engine_failed:
                    self.failure = engine_failure(message)
                else:
                    self.failure = APIError(502, message, type=ENGINE_ERROR, code="detokenizer_error")
            else:
                self.finish = delta.finish
                self.stop_reason = self.stop_rules.client_stop_reason(delta.stop_reason)
            self.done = True
        self.wakeup.set()
        return text

    def _count_tokens(self, n_tokens: int) -> None:
        """The tokens a delta says the request has so far; the first that has any marks the first output."""
        if not self.first_output_at and n_tokens:
            self.first_output_at = time.monotonic()
            self.first_output_tokens = n_tokens
        if n_tokens > self.n_tokens:
            self.n_tokens = n_tokens

    def _take_plain(self, text: str) -> bool:
        """Plain text to the sink while nothing is buffered and it takes it now (order kept), else to the buffer for
        the handler; True when buffered."""
        if text and (self._pieces or self.sink is None or not self.sink.write(text)):
            self._pieces.append(text)
            self.pending_chars += len(text)
            return True
        return False

    def _gap(self) -> None:
        self.fail(APIError(502, GAP_ERROR, type=ENGINE_ERROR, code="detokenizer_error"), drop_text=False)

    def _accept_entries(self, entries: list[Any], n_tokens: int, reassembly: TokenEntries, into: list[Any]) -> bool:
        """A delta's per-token entries (logprobs or ids) not delivered yet go `into` the untaken ones; a gap fails
        the stream."""
        fresh = reassembly.take(entries, n_tokens)
        if fresh is None:
            self._gap()
            return False
        into += fresh
        return True

    def take_logprobs(self) -> list[LogprobText]:
        """The logprob entries not taken yet (with the text `wait` returned), in token order."""
        entries, self._logprobs = self._logprobs, []
        return entries

    def take_token_ids(self) -> list[int]:
        """The output ids not taken yet (return_token_ids), in token order."""
        ids, self._token_ids = self._token_ids, []
        return ids

    def _accept_parsed(self, delta: TextDelta) -> bool:
        assert self.parsed_reassembly is not None and self._parsed is not None
        # a refused Open's final delta carries no parsed part (nothing was decoded): its text, if any, is content
        parsed = delta.parsed if delta.parsed is not None else ParsedDelta(delta.text, delta.offset)
        fresh = self.parsed_reassembly.take(parsed)
        if fresh is None:
            self._gap()
            return False
        news = self._parsed
        self.reasoning_tokens = fresh.reasoning_tokens
        news.content += fresh.content
        news.reasoning += fresh.reasoning
        for call in fresh.tool_calls:
            news.add_tool(call.index, call.name, call.arguments, call.id)
            self.tool_calls_seen = True
        self.pending_chars += (
            len(fresh.content) + len(fresh.reasoning) + sum(len(c.arguments) for c in fresh.tool_calls)
        )
        return True

    def ttft_s(self, started: float) -> float | None:
        """Seconds from `started` (the request's arrival, time.monotonic()) to its first output delta."""
        return self.first_output_at - started if self.first_output_at else None

    def mean_itl_s(self) -> float | None:
        """Mean seconds per output token after the first delta, for a request that finished normally with output
        after its first delta (per request, not per token: deltas carry several tokens)."""
        later_tokens = self.n_tokens - self.first_output_tokens
        if self.failure is not None or not self.ended_at or not self.first_output_at or later_tokens <= 0:
            return None
        return (self.ended_at - self.first_output_at) / later_tokens

    def fail(self, error: APIError, *, drop_text: bool) -> None:
        """End the stream with `error`. A stream that already ended keeps its end, unless drop_text: then the text
        its handler has not taken is dropped (the front's output budget) and the error replaces the end."""
        if self.done and not drop_text:
            return
        self.failure = error
        self.done = True
        if drop_text:
            self._pieces.clear()
            if self._parsed is not None:
                self._parsed = ParsedOutput()
            self.pending_chars = 0
        self.wakeup.set()

    @property
    def started(self) -> bool:
        """Its first delta came, or it ended."""
        return self.answered or self.done

    @property
    def has_news(self) -> bool:
        return bool(self._pieces or self._parsed or self._logprobs or self._token_ids)

    def take(self) -> str | ParsedOutput:
        """All text not taken yet (for a request with parsers: the channels' news), released."""
        if self._parsed is not None:
            news, self._parsed = self._parsed, ParsedOutput()
            self.pending_chars = 0
            return news
        text = "".join(self._pieces)
        self._pieces.clear()
        self.pending_chars = 0
        return text
