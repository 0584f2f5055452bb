"""`<think>...</think>` reasoning (Qwen3, DeepSeek-R1 and the many models that copy them), and the other ways
families mark it (Granite's phrases, MiniMax-M2's content with the marker put back).

States: OPENING (the output may start with the start marker: hold while it could), REASONING (until the end
marker), CONTENT (everything after). Where a request starts is decided once, from the end of its prompt
(`initial_state`): a template that pre-fills `<think>` starts in REASONING, one that closes the block (Qwen3's
`enable_thinking: false` renders `<think>\n\n</think>\n\n`) starts in CONTENT, otherwise the family's default:
Qwen3 reasons only when the output opens with `<think>`; DeepSeek-R1 reasons from the first character (its template
pre-fills the marker, and the model may or may not repeat it). vLLM 0.32's parsers (qwen3 as `qwen3_vllm`, glm45,
kimi_k2, minimax_m2) read no prompt: they reason from the first character, with the rules of `ThinkStage`'s options
(thinking off by the request's template arguments, they are not run at all: `THINKING_SWITCHED`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from detok_worker.parse.base import ParsedOutput, TextStage, trailing_space

THINK_START = "<think>"
THINK_END = "</think>"


class ThinkState(Enum):
    OPENING_TO_CONTENT = 1  # no marker yet; output that does not open with <think> is content (qwen3)
    OPENING_TO_REASONING = 2  # no marker yet; output reasons either way, an opening <think> is dropped (deepseek_r1)
    REASONING = 3
    CONTENT = 4


def initial_state(
    prompt_tail_text: str, default: ThinkState, start: str = THINK_START, end: str = THINK_END
) -> ThinkState:
    """Where the output starts, from the last marker in the end of the prompt (if any)."""
    opened, closed = prompt_tail_text.rfind(start), prompt_tail_text.rfind(end)
    if opened > closed:
        return ThinkState.REASONING
    if closed > opened:
        return ThinkState.CONTENT
    return default


class ThinkStage(TextStage):
    """`start` / `end`: the markers, or several spellings of each (Granite's phrases). The options, each a rule of
    one of vLLM 0.32's parsers besides the markers' places:
    `absorb` (qwen3): a start marker inside the reasoning and an end marker in the content are markup, dropped (the
    content is then scanned for it); `reopen` (glm45): a start marker in the content opens the reasoning again;
    `implicit_ends` (glm45's `<tool_call>`, kimi_k2's and minimax_m2's calls): markers that end the reasoning too and
    are content themselves (the tool-call stage reads them); `trim`: the reasoning's trailing whitespace is dropped
    (held until more reasoning follows, which only `reopen` allows after an end marker)."""

    def __init__(
        self,
        state: ThinkState,
        start: str | tuple[str, ...] = THINK_START,
        end: str | tuple[str, ...] = THINK_END,
        *,
        absorb: bool = False,
        reopen: bool = False,
        implicit_ends: tuple[str, ...] = (),
        trim: bool = False,
    ) -> None:
        self.state = state
        self.starts = (start,) if isinstance(start, str) else start
        self.ends = (end,) if isinstance(end, str) else end
        self.implicit_ends = implicit_ends
        self.trim = trim
        self._reasoning_markers = (*self.ends, *implicit_ends, *(self.starts if absorb else ()))
        self._content_markers = (*(self.ends if absorb else ()), *(self.starts if reopen else ()))
        self._space = ""  # trim: the reasoning's whitespace not yet followed by more reasoning

    def _step(self, buffer: str, out: ParsedOutput) -> str:
        state = self.state
        if state is ThinkState.CONTENT and not self._content_markers:
            out.content += buffer
            return ""
        if state is ThinkState.OPENING_TO_CONTENT or state is ThinkState.OPENING_TO_REASONING:
            if any(len(buffer) < len(start) and start.startswith(buffer) for start in self.starts):
                self._held = buffer
                return ""
            opening = next((start for start in self.starts if buffer.startswith(start)), "")
            if not opening and state is ThinkState.OPENING_TO_CONTENT:
                self.state = ThinkState.CONTENT
                out.content += buffer
                return ""
            self.state = ThinkState.REASONING
            return buffer[len(opening) :]
        if state is ThinkState.REASONING:
            before, marker, rest = self._cut(buffer, self._reasoning_markers)
            self._reason(before, out)
            if marker in self.ends or marker in self.implicit_ends:
                self.state = ThinkState.CONTENT
                if marker in self.implicit_ends:
                    out.content += marker
            return rest
        # content, dropping end markers (absorb) and reasoning again at start markers (reopen)
        before, marker, rest = self._cut(buffer, self._content_markers)
        out.content += before
        if marker in self.starts:
            self.state = ThinkState.REASONING
        return rest

    def _reason(self, text: str, out: ParsedOutput) -> None:
        if self.trim:
            text, self._space = trailing_space(self._space, text)
        out.reasoning += text

    def finish(self, out: ParsedOutput) -> None:
        held, self._held = self._held, ""
        if self.state in (ThinkState.REASONING, ThinkState.OPENING_TO_REASONING):
            self._reason(held, out)
        else:
            out.content += held
        self._space = ""


class PrefixedContent(TextStage):
    """No reasoning: the whole output is content, with `prefix` in front of it (vLLM 0.32's
    minimax_m2_append_think: MiniMax-M2's template opens the think block in the prompt, and the content carries
    it back with its `<think>` for clients that keep it in the conversation)."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix

    def feed(self, text: str, out: ParsedOutput) -> None:
        out.content += self._prefix + text
        self._prefix = ""

    def finish(self, out: ParsedOutput) -> None:
        out.content += self._prefix
        self._prefix = ""


@dataclass(frozen=True, slots=True)
class CountedMarkers:
    """The marker tokens by which vLLM's parser of a family counts reasoning tokens (ReasoningTokenCount): `ends`
    end the reasoning (`pairs`: each end closes one start instead); `tool_call` (its opening and closing markers):
    a start marker in the content reasons again, but not inside a tool call, which the opening marker also starts
    from the reasoning; `aside`: the family's other markers. No marker counts."""

    start: str = THINK_START
    ends: tuple[str, ...] = (THINK_END,)
    pairs: bool = False
    tool_call: tuple[str, str] | None = None
    aside: tuple[str, ...] = ()


class ReasoningTokenCount:
    """vLLM's count of a request's reasoning tokens (usage.completion_tokens_details.reasoning_tokens), over its
    output ids, for families whose markers are single tokens. By default (vLLM 0.32's parser engine: qwen3, glm45,
    kimi_k2, minimax_m2; it reads no prompt): the ids from the start of the output up to the first end marker,
    markers (`aside` and the others) aside; with `tool_call` (glm45) also those after a start marker in the content,
    up to the next end marker or a tool call. `pairs` (vLLM's deepseek_r1, its BaseThinkingReasoningParser): the
    ids inside start ... end pairs of the output itself, markers aside (a start the prompt holds does not count).
    Per batch of ids: the markers are looked for with set.isdisjoint, ids are only walked one by one in a batch that
    holds one."""

    __slots__ = ("start_id", "end_ids", "tool_call_ids", "pairs", "markers", "depth", "in_tool_call", "count")

    def __init__(self, markers: CountedMarkers, ids: Mapping[str, int]) -> None:
        """`ids`: the token id of each of `markers`."""
        self.start_id = ids[markers.start]
        self.end_ids = frozenset(ids[end] for end in markers.ends)
        self.tool_call_ids = tuple(ids[marker] for marker in markers.tool_call or ())
        self.pairs = pairs = markers.pairs
        self.markers = frozenset(ids.values())
        # pairs: the markers' nesting depth; else 1 while the output reasons, 0 once it ended
        self.depth = 0 if pairs else 1
        self.in_tool_call = False
        self.count = 0

    def add(self, ids: list[int]) -> None:
        if self.markers.isdisjoint(ids):
            if self.depth:
                self.count += len(ids)
            return
        if self.pairs:
            self._add_pairs(ids)
            return
        if not self.depth and not self.tool_call_ids:
            return  # the reasoning ended for good
        start, ends, markers = self.start_id, self.end_ids, self.markers
        opening, closing = self.tool_call_ids or (-1, -1)
        for token_id in ids:
            if self.in_tool_call:
                self.in_tool_call = token_id != closing
            elif token_id == opening:
                self.depth, self.in_tool_call = 0, True
            elif self.depth:
                if token_id in ends:
                    self.depth = 0
                elif token_id not in markers:
                    self.count += 1
            elif token_id == start and self.tool_call_ids:
                self.depth = 1

    def _add_pairs(self, ids: list[int]) -> None:
        start, end = self.start_id, next(iter(self.end_ids))
        for token_id in ids:
            if token_id == start:
                self.depth += 1
            elif token_id == end:
                self.depth = max(self.depth - 1, 0)
            elif self.depth:
                self.count += 1
