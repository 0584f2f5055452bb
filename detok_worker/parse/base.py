"""What every output parser is: text in (as it is decoded), pieces per channel out.

The rule that keeps streaming exact: a parser's output after some input text depends only on that text, never on
how it was cut into pieces (each parser holds back a suffix that may still become a marker, or a tool call's
markup that what follows will confirm or turn into content, and nothing else).
So streaming the pieces and parsing the whole text give the same channels, and a worker that re-opens a request
and decodes its history in one piece reproduces what the first worker emitted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class ToolCallPiece:
    """A piece of tool call `index`: its name (on the call's first piece only, else "") and/or arguments text;
    `id` the call's id as the model wrote it (Kimi-K2's `functions.NAME:IDX`), on the first piece only, "" when the
    model writes none (the front makes one)."""

    index: int
    name: str = ""
    arguments: str = ""
    id: str = ""


@dataclass(slots=True)
class ParsedOutput:
    """What one feed (or the final flush) adds to each channel."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallPiece] = field(default_factory=list)

    def add_tool(self, index: int, name: str = "", arguments: str = "", call_id: str = "") -> None:
        last = self.tool_calls[-1] if self.tool_calls else None
        if last is not None and last.index == index and not name:
            last.arguments += arguments
        else:
            self.tool_calls.append(ToolCallPiece(index, name, arguments, call_id))

    def extend(self, other: ParsedOutput) -> None:
        self.content += other.content
        self.reasoning += other.reasoning
        for piece in other.tool_calls:
            self.add_tool(piece.index, piece.name, piece.arguments, piece.id)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


class TextStage(ABC):
    """A stage that turns incoming text into content + its own channel (reasoning or tool calls).

    A stage that scans for markers keeps the text it holds back in `_held` and reads the rest in `_step`s."""

    _held = ""

    def feed(self, text: str, out: ParsedOutput) -> None:
        """Add what `text` makes certain to `out`."""
        buffer, self._held = self._held + text, ""
        while buffer:
            buffer = self._step(buffer, out)

    def _step(self, buffer: str, out: ParsedOutput) -> str:
        """Read the start of `buffer`; return the rest ("" once all is read or held)."""
        raise NotImplementedError

    def _cut(self, buffer: str, markers: Sequence[str]) -> tuple[str, str, str]:
        """(text before the first marker, the marker, the rest) when a marker is in `buffer` (the earliest, the
        longest on a tie); otherwise (the text that is certainly not part of a marker, "", "") and the suffix that
        may still become one is held back."""
        at, marker = -1, ""
        for candidate in markers:
            found = buffer.find(candidate)
            if found >= 0 and (at < 0 or found < at or (found == at and len(candidate) > len(marker))):
                at, marker = found, candidate
        if at >= 0:
            return buffer[:at], marker, buffer[at + len(marker) :]
        kept = len(buffer) - held_suffix_len(buffer, markers)
        self._held = buffer[kept:]
        return buffer[:kept], "", ""

    @abstractmethod
    def finish(self, out: ParsedOutput) -> None:
        """Add what was held back to `out` (a partial marker is plain text after all)."""


class OutputParser:
    """An incremental parser of one request's output text: a chain of stages, each taking the previous one's
    content as its input (a reasoning stage, then a tool-call stage)."""

    def __init__(self, stages: list[TextStage]) -> None:
        self._stages = stages

    def feed(self, text: str) -> ParsedOutput:
        """Take the next piece of output text; return what it makes certain."""
        return self._run(text, final=False)

    def finish(self) -> ParsedOutput:
        """The output ended: release what was held back."""
        return self._run("", final=True)

    def _run(self, text: str, *, final: bool) -> ParsedOutput:
        out = ParsedOutput()
        for stage in self._stages:
            if stage is not self._stages[0]:
                text, out.content = out.content, ""
            if text:
                stage.feed(text, out)
            if final:
                stage.finish(out)
        return out


def held_suffix_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def trailing_space(held: str, text: str) -> tuple[str, str]:
    """`held + text` without its trailing whitespace, and that whitespace (held until more text follows it)."""
    text = held + text
    kept = text.rstrip()
    return kept, text[len(kept) :]
