"""`<think>...</think>` reasoning (Qwen3, DeepSeek-R1 and the many models that copy them).

States: OPENING (the output may start with the start marker: hold while it could), REASONING (until the end
marker), CONTENT (everything after; never scanned again). Where a request starts is decided once, from the end of
its prompt (`initial_state`): a template that pre-fills `<think>` starts in REASONING, one that closes the block
(Qwen3's `enable_thinking: false` renders `<think>\n\n</think>\n\n`) starts in CONTENT, otherwise the family's
default: Qwen3 reasons only when the output opens with `<think>`; DeepSeek-R1 reasons from the first character (its
template pre-fills the marker, and the model may or may not repeat it). vLLM 0.32's qwen3 parser (`qwen3_vllm`, what
`--reasoning-parser qwen3` means on `--source vllm`) reads no prompt: it reasons from the first character (thinking
off, the request's `enable_thinking: false`, it is not run at all: parse/registry.py THINKING_SWITCHED), and drops
a start marker inside the reasoning and an end marker in the content.
"""

from __future__ import annotations

from enum import Enum

from detok_worker.parse.base import ParsedOutput, TextStage
from detok_worker.parse.markers import split_before_marker

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
    """`absorb`: vLLM 0.32's qwen3 rule besides the markers' places: a start marker inside the reasoning and an end
    marker in the content are markup, dropped (the content is then scanned for it)."""

    def __init__(self, state: ThinkState, start: str = THINK_START, end: str = THINK_END, absorb: bool = False) -> None:
        self.state = state
        self.start = start
        self.end = end
        self.absorb = absorb
        self._held = ""

    def feed(self, text: str, out: ParsedOutput) -> None:
        state = self.state
        if state is ThinkState.CONTENT and not self.absorb:
            out.content += text
            return
        buffer = self._held + text
        self._held = ""
        if state is ThinkState.OPENING_TO_CONTENT or state is ThinkState.OPENING_TO_REASONING:
            if len(buffer) < len(self.start) and self.start.startswith(buffer):
                self._held = buffer
                return
            if buffer.startswith(self.start):
                buffer = buffer[len(self.start) :]
            elif state is ThinkState.OPENING_TO_CONTENT:
                self.state = ThinkState.CONTENT
                out.content += buffer
                return
            self.state = ThinkState.REASONING
        while buffer:
            if self.state is ThinkState.REASONING:
                markers = (self.end, self.start) if self.absorb else (self.end,)
                before, marker, rest = split_before_marker(buffer, markers)
                out.reasoning += before
                if marker == self.end:
                    self.state = ThinkState.CONTENT
                    if not self.absorb:
                        out.content += rest
                        return
            else:  # content, dropping end markers (absorb)
                before, marker, rest = split_before_marker(buffer, (self.end,))
                out.content += before
            if not marker:
                self._held = rest
                return
            buffer = rest

    def finish(self, out: ParsedOutput) -> None:
        held, self._held = self._held, ""
        if self.state in (ThinkState.REASONING, ThinkState.OPENING_TO_REASONING):
            out.reasoning += held
        else:
            out.content += held


class ReasoningTokenCount:
    """vLLM's count of a request's reasoning tokens (usage.completion_tokens_details.reasoning_tokens), over its
    output ids, for families whose think markers are single tokens. `until_end` (vLLM 0.32's qwen3 parser): the ids
    before the first end marker, start markers aside, from the start of the output unless the prompt closed the
    block (then none). Else (vLLM's deepseek_r1, its BaseThinkingReasoningParser): the ids inside start ... end
    pairs of the output itself, markers aside (a start the prompt holds does not count). Per batch of ids: the
    markers are looked for with list methods, ids are only walked one by one in a batch that holds one."""

    __slots__ = ("start_id", "end_id", "until_end", "depth", "count")

    def __init__(self, start_id: int, end_id: int, *, until_end: bool, counting: bool = True) -> None:
        self.start_id = start_id
        self.end_id = end_id
        self.until_end = until_end
        # until_end: 1 while the output reasons, 0 once it ended (or never began); else the markers' nesting depth
        self.depth = int(counting) if until_end else 0
        self.count = 0

    def add(self, ids: list[int]) -> None:
        start, end = self.start_id, self.end_id
        if self.until_end:
            if not self.depth:
                return
            if end in ids:
                ids = ids[: ids.index(end)]
                self.depth = 0
            self.count += len(ids) - ids.count(start)
            return
        if start not in ids and end not in ids:
            if self.depth:
                self.count += len(ids)
            return
        for token_id in ids:
            if token_id == start:
                self.depth += 1
            elif token_id == end:
                self.depth = max(self.depth - 1, 0)
            elif self.depth:
                self.count += 1
