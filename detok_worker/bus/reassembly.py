"""The exactly-once rule for one request's text, used by every receiver of TextDeltas (the HTTP front, the bus
collector that tests, benches and `detok trace replay` use).

Each TextDelta says at which character of the request's output its text starts (`offset`). A receiver keeps
how many characters it has delivered. A delta that starts at or before that point gives only the part not
delivered yet (after a worker dies, the engine re-opens the request elsewhere and the new worker re-sends the
text from offset 0). A delta that starts past it is a gap: characters were lost on the way, so no later text of
that request can be delivered in the right place. `take` then returns None, delivers nothing, and the receiver
ends the request with GAP_ERROR: a client gets an error, never a text with a hole in it.
"""

from __future__ import annotations

from typing import TypeVar

from detok_worker.bus.messages import ParsedDelta, TextDelta, ToolCallDelta

T = TypeVar("T")

GAP_ERROR = "text of this request was lost between the detokenizer and the front (a gap in its deltas)"


class DeltaReassembly:
    __slots__ = ("delivered", "duplicate_chars", "gap")

    def __init__(self) -> None:
        self.delivered = 0  # characters of output delivered so far
        self.duplicate_chars = 0  # re-sent characters dropped
        self.gap = False

    def take(self, delta: TextDelta) -> str | None:
        """The part of `delta.text` not delivered yet (possibly ""); None on a gap."""
        return self.take_text(delta.offset, delta.text)

    def take_text(self, offset: int, text: str) -> str | None:
        """`take` for a delta read from a TextBatch's columns (its offset and text, no TextDelta made)."""
        skip = self.delivered - offset
        if skip:
            if skip < 0:
                self.gap = True
                return None
            fresh = text[skip:]
            self.duplicate_chars += len(text) - len(fresh)
            text = fresh
        self.delivered += len(text)
        return text


class TokenEntries:
    """The same rule for what a delta carries per consumed token (TextDelta.logprobs, TextDelta.token_ids): a delta's
    entries are of tokens n_tokens - len(entries) .. n_tokens - 1, so a receiver keeps how many it has delivered and
    drops the re-sent ones by that token index; entries that start past it are a gap. `take` returns the new ones
    (possibly []), None on a gap."""

    __slots__ = ("delivered",)

    def __init__(self) -> None:
        self.delivered = 0  # entries delivered so far: those of tokens 0 .. delivered - 1

    def take(self, entries: list[T], n_tokens: int) -> list[T] | None:
        skip = self.delivered - (n_tokens - len(entries))
        if skip < 0:
            return None
        fresh = entries[skip:] if skip else entries
        self.delivered += len(fresh)
        return fresh


class ParsedReassembly:
    """The same rule per channel of a parsed request (TextDelta.parsed): content, reasoning and each tool call's
    arguments have their own offset; a tool call's name is delivered once. `take` returns the new part, None on
    a gap in any channel."""

    __slots__ = ("content", "reasoning", "arguments", "gap")

    def __init__(self) -> None:
        self.content = 0
        self.reasoning = 0
        self.arguments: dict[int, int] = {}  # tool call index (named) -> arguments characters delivered
        self.gap = False

    def take(self, parsed: ParsedDelta) -> ParsedDelta | None:
        content = _fresh(parsed.content, parsed.content_offset, self.content)
        reasoning = _fresh(parsed.reasoning, parsed.reasoning_offset, self.reasoning)
        if content is None or reasoning is None:
            self.gap = True
            return None
        calls: list[ToolCallDelta] = []
        for call in parsed.tool_calls:
            delivered = self.arguments.get(call.index)
            name, call_id = (call.name, call.id) if delivered is None else ("", "")
            if delivered is None and not call.name:
                self.gap = True  # arguments of a call whose name never came
                return None
            arguments = _fresh(call.arguments, call.arguments_offset, delivered or 0)
            if arguments is None:
                self.gap = True
                return None
            self.arguments[call.index] = (delivered or 0) + len(arguments)
            if name or arguments:
                calls.append(ToolCallDelta(call.index, name, arguments, call.arguments_offset, call_id))
        self.content += len(content)
        self.reasoning += len(reasoning)
        return ParsedDelta(
            content, parsed.content_offset, reasoning, parsed.reasoning_offset, calls, parsed.reasoning_tokens
        )


def _fresh(text: str, offset: int, delivered: int) -> str | None:
    """The part of `text` (starting at `offset` of its channel) past `delivered`; None if it starts past it."""
    skip = delivered - offset
    if skip < 0:
        return None
    return text[skip:] if skip else text
