"""One live request as the front sees it: the text its HTTP handler has not taken yet, and how it ended."""

from __future__ import annotations

import asyncio

from detok_worker.bus.messages import (
    FINISH_ERROR,
    ParsedDelta,
    TextDelta,
)
from detok_worker.bus.reassembly import GAP_ERROR, DeltaReassembly, ParsedReassembly
from detok_worker.front.errors import ENGINE_ERROR, APIError
from detok_worker.parse.base import ParsedOutput
from detok_worker.stream.stop.rules import StopRules


class RequestStream:
    """One request's text as it arrives, and how it ended. Only the event loop thread touches it."""

    __slots__ = (
        "rid",
        "prompt_tokens",
        "deadline",
        "reassembly",
        "pending_chars",
        "n_tokens",
        "finish",
        "stop_reason",
        "failure",
        "done",
        "_pieces",
        "_parsed",
        "parsed_reassembly",
        "tool_calls_seen",
        "_stop_rules",
        "_wakeup",
    )

    def __init__(
        self,
        rid: str,
        prompt_tokens: int,
        deadline: float,
        stop_rules: StopRules,
        parsed: bool = False,
        wakeup: asyncio.Event | None = None,
    ) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.deadline = deadline
        self.reassembly = DeltaReassembly()
        self.pending_chars = 0  # accepted but not yet taken by the handler
        self.n_tokens = 0
        self.finish: str | None = None
        self.stop_reason: str | int | None = None
        self.failure: APIError | None = None
        self.done = False
        self._pieces: list[str] = []
        # a request with parsers: its news are channels (reasoning, content, tool calls), not plain text
        self._parsed: ParsedOutput | None = ParsedOutput() if parsed else None
        self.parsed_reassembly: ParsedReassembly | None = ParsedReassembly() if parsed else None
        self.tool_calls_seen = False
        self._stop_rules = stop_rules
        # the n choices of one HTTP request share one event: their handler waits for news from any of them
        self._wakeup = wakeup or asyncio.Event()

    def accept(self, delta: TextDelta) -> str | None:
        """Take a delta; returns the text it adds (None on a gap, which fails the stream)."""
        text = self.reassembly.take(delta)
        if text is None:
            self.fail(APIError(502, GAP_ERROR, type=ENGINE_ERROR, code="detokenizer_error"), drop_text=False)
            return None
        if self._parsed is not None:
            if not self._accept_parsed(delta):
                return None
        elif text:
            self._pieces.append(text)
            self.pending_chars += len(text)
        self.n_tokens = max(self.n_tokens, delta.n_tokens)
        if delta.finish is not None:
            if delta.finish == FINISH_ERROR:
                message = delta.error or "the detokenizer failed on this request"
                self.failure = APIError(502, message, type=ENGINE_ERROR, code="detokenizer_error")
            else:
                self.finish = delta.finish
                self.stop_reason = self._stop_rules.client_stop_reason(delta.stop_reason)
            self.done = True
        self._wakeup.set()
        return text

    def _accept_parsed(self, delta: TextDelta) -> bool:
        assert self.parsed_reassembly is not None and self._parsed is not None
        # a worker that does not parse (an older one) sends plain text: all of it is content
        parsed = delta.parsed if delta.parsed is not None else ParsedDelta(delta.text, delta.offset)
        fresh = self.parsed_reassembly.take(parsed)
        if fresh is None:
            self.fail(APIError(502, GAP_ERROR, type=ENGINE_ERROR, code="detokenizer_error"), drop_text=False)
            return False
        news = self._parsed
        news.content += fresh.content
        news.reasoning += fresh.reasoning
        for call in fresh.tool_calls:
            news.add_tool(call.index, call.name, call.arguments)
            self.tool_calls_seen = True
        self.pending_chars += (
            len(fresh.content) + len(fresh.reasoning) + sum(len(c.arguments) for c in fresh.tool_calls)
        )
        return True

    def fail(self, error: APIError, *, drop_text: bool) -> None:
        if self.done:
            return
        self.failure = error
        self.done = True
        if drop_text:
            self._pieces.clear()
            if self._parsed is not None:
                self._parsed = ParsedOutput()
            self.pending_chars = 0
        self._wakeup.set()

    @property
    def wakeup(self) -> asyncio.Event:
        return self._wakeup

    @property
    def has_news(self) -> bool:
        return bool(self._pieces or self._parsed)

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
