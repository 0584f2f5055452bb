"""Text-level stop-string matching: an Aho-Corasick automaton whose state carries across calls.

The automaton is compiled once per distinct set of stop strings and shared by every request that uses it
(`compile_stop_strings` caches it). Its state after some text is the longest suffix of that text that is a prefix of
some stop string, so the text to hold back is read off the state (`hold_len`) instead of being searched for. In
fact the held text is a function of the state alone (its last `hold_len` characters), so a request keeps nothing
but the state: a `StopStringFilter`.

Speed: scanning a piece of text from a given state is a pure function, and streamed text is made of token texts
that repeat a lot, so results (including the text to release) are memoized per (state, text). The common step is
then one dict lookup, whatever the number of stop strings; texts that lead from the root straight back to it
(nothing held, no match) are also kept in a set, so a whole batch of them is checked with one C-level call.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

ROOT = 0
_UNKNOWN = -2  # a lazily made field of a state not needed yet
# Only short texts are memoized (token texts are short; long texts are rarely seen twice).
_MEMO_MAX_TEXT_LEN = 64
# Memo entries per automaton before its memo is cleared (about 1 MB); token texts are Zipf-distributed, so a few
# thousand entries catch nearly all steps. With the automaton cache below, a worker's memos stay under ~32 MB.
_MEMO_MAX_ENTRIES = 4096
_CACHED_AUTOMATA = 32

# A memoized scan of `text` from `state`, as a plain tuple (the hot loop unpacks it):
# (end_state, released, match_end, pattern). end_state: the state after the text. released: the text to release
# if no match stops the stream (held text of `state` + text, minus the held text of end_state). match_end: the
# index in the text just past the earliest-ending stop string, -1 if none. pattern: the index of that stop string
# (the longest one ending there, i.e. the one that starts earliest), -1 if none.
ScanResult = tuple[int, str, int, int]


class StopStringMatch(NamedTuple):
    """The stop string that stopped the stream and whether it stays visible in the output."""

    stop: str
    visible: bool


class StopStringAutomaton:
    """Aho-Corasick automaton over stop strings, built lazily: a state (a prefix of some stop string) and its
    failure link, match and hold length are made the first time a scan needs them, so compiling costs O(number of
    stop strings) and memory grows with the text actually scanned (at most linear in the stop strings' length): an
    eager build of the limits' largest set (64 strings of 1,024 characters) would stall the worker's loop.

    `longest_match_of(s)` is the index of the longest stop string that is a suffix of state s (-1 if none).
    `hold_len_of(s)` is the length of the longest suffix of state s that is a proper prefix of some stop string:
    the text a request must hold back while in state s.
    """

    def __init__(self, hidden: Sequence[str], visible: Sequence[str]) -> None:
        self.patterns: tuple[str, ...] = (*hidden, *visible)
        self.visible: tuple[bool, ...] = (False,) * len(hidden) + (True,) * len(visible)
        # Per state; None / _UNKNOWN until needed. goto: trie children, made from `_candidates` (the stop
        # strings the state is a prefix of) when first expanded.
        self.goto: list[dict[str, int] | None] = [None]
        self._candidates: list[list[int] | None] = [list(range(len(self.patterns)))]
        self._parent = [ROOT]
        self._edge = [""]
        self._depth = [0]
        self._terminal = [-1]
        self._origin = [0]  # a pattern whose prefix the state is (the state's text is origin's first depth chars)
        self.fail = [ROOT]
        self.longest_match = [-1]
        self.hold_len = [0]
        self._children(ROOT)
        # memo[s][text]: the ScanResult of text from s. root_passthrough: texts that lead from the root back to it
        # without a match (the most common case).
        self.memo: defaultdict[int, dict[str, ScanResult]] = defaultdict(dict)
        self.root_passthrough: set[str] = {""}
        self._memo_entries = 0

    def _children(self, state: int) -> dict[str, int]:
        goto = self.goto[state]
        if goto is not None:
            return goto
        goto = self.goto[state] = {}
        candidates = self._candidates[state] or ()
        self._candidates[state] = None
        depth = self._depth[state] + 1
        for index in candidates:
            pattern = self.patterns[index]
            if len(pattern) < depth:
                continue
            ch = pattern[depth - 1]
            child = goto.get(ch)
            if child is None:
                child = goto[ch] = len(self.goto)
                self.goto.append(None)
                self._candidates.append([])
                self._parent.append(state)
                self._edge.append(ch)
                self._depth.append(depth)
                self._terminal.append(-1)
                self._origin.append(index)
                self.fail.append(ROOT if state == ROOT else _UNKNOWN)
                self.longest_match.append(_UNKNOWN)
                self.hold_len.append(_UNKNOWN)
            if len(pattern) == depth:
                self._terminal[child] = index
            else:
                self._candidates[child].append(index)  # type: ignore[union-attr]
        return goto

    def _fail_of(self, state: int) -> int:
        """The failure link of `state`, made (with those of its ancestors and of the states on their failure
        chains) iteratively: chains can be 1,024 deep, deeper than Python's recursion limit."""
        fail = self.fail
        stack = [state]
        while stack:
            current = stack[-1]
            if fail[current] != _UNKNOWN:
                stack.pop()
                continue
            parent = self._parent[current]
            if fail[parent] == _UNKNOWN:
                stack.append(parent)
                continue
            ch = self._edge[current]
            candidate = fail[parent]
            while True:  # the standard step: follow the parent's failure chain until a state has a ch child
                nxt = self._children(candidate).get(ch)
                if nxt is not None or candidate == ROOT:
                    fail[current] = ROOT if nxt is None else nxt
                    stack.pop()
                    break
                if fail[candidate] == _UNKNOWN:
                    stack.append(candidate)
                    break
                candidate = fail[candidate]
        return fail[state]

    def _resolve(self, state: int) -> None:
        """Make longest_match and hold_len of `state` and of the unresolved states on its failure chain."""
        chain = []
        while self.hold_len[state] == _UNKNOWN:
            chain.append(state)
            state = self._fail_of(state)
        for current in reversed(chain):
            fallback = self.fail[current]
            terminal = self._terminal[current]
            self.longest_match[current] = terminal if terminal >= 0 else self.longest_match[fallback]
            self.hold_len[current] = self._depth[current] if self._children(current) else self.hold_len[fallback]

    def _next(self, state: int, ch: str) -> int:
        while True:
            nxt = self._children(state).get(ch)
            if nxt is not None:
                if self.hold_len[nxt] == _UNKNOWN:
                    self._resolve(nxt)
                return nxt
            if state == ROOT:
                return ROOT
            state = self._fail_of(state)

    def held_text(self, state: int) -> str:
        """The text a request in this state holds back: the state's last hold_len characters."""
        end = self._depth[state]
        return self.patterns[self._origin[state]][end - self.hold_len[state] : end]

    def scan(self, state: int, text: str) -> ScanResult:
        """Run the automaton over `text` from `state` (memoized for short texts)."""
        result = self.memo[state].get(text)
        if result is not None:
            return result
        result = self._scan_uncached(state, text)
        if len(text) <= _MEMO_MAX_TEXT_LEN:
            if self._memo_entries >= _MEMO_MAX_ENTRIES:
                self.memo.clear()
                self.root_passthrough.clear()
                self.root_passthrough.add("")
                self._memo_entries = 0
            self.memo[state][text] = result
            if state == ROOT and result[0] == ROOT and result[2] < 0:
                self.root_passthrough.add(text)
            self._memo_entries += 1
        return result

    def _scan_uncached(self, state: int, text: str) -> ScanResult:
        longest_match = self.longest_match
        combined = self.held_text(state) + text
        match_end = -1
        pattern = -1
        for i, ch in enumerate(text):
            state = self._next(state, ch)
            if match_end < 0 and longest_match[state] >= 0:
                match_end = i + 1
                pattern = longest_match[state]
        return state, combined[: len(combined) - self.hold_len[state]], match_end, pattern


@lru_cache(maxsize=_CACHED_AUTOMATA)
def compile_stop_strings(hidden: tuple[str, ...], visible: tuple[str, ...]) -> StopStringAutomaton:
    """The shared automaton for these stop strings (callers pass validated, non-empty, disjoint strings)."""
    return StopStringAutomaton(hidden, visible)


class StopStringFilter:
    """Per-request stop-string state over a stream of text pieces: holds back possible starts of a stop string.

    `feed(texts, checked_from)` takes the text pieces of consecutive tokens; matches that end in pieces before
    index `checked_from` are ignored (the min_tokens phase), but the text that could start a stop string is still
    held back. It returns the text released now and the match that stops the stream, if any.
    `state` is the automaton's state: a caller that steps the filter by the automaton's memo of scans with no match
    (StopSequenceDecoder.process_one) moves it to the scan's end state, exactly as feed() would.
    """

    __slots__ = ("_automaton", "state")

    def __init__(self, automaton: StopStringAutomaton) -> None:
        self._automaton = automaton
        self.state = ROOT

    @property
    def held(self) -> str:
        """The text held back because it may be the start of a stop string."""
        return self._automaton.held_text(self.state)

    def reset(self) -> None:
        self.state = ROOT

    def feed_one(self, text: str, check: bool = True) -> tuple[str, StopStringMatch | None]:
        """Feed one token's text; `check` False means matches ending in it are ignored."""
        released, _, match = self.feed((text,), 0 if check else 1)
        return released, match

    def feed(self, texts: Sequence[str], checked_from: int = 0) -> tuple[str, int, StopStringMatch | None]:
        """Feed the texts of consecutive tokens. Returns (released text, index of the text that completed the
        match or len(texts) if none, the match or None). The worker's hot path: keep it lean."""
        automaton = self._automaton
        state = self.state
        if state == ROOT:  # the common case: texts that lead from the root straight back to it
            if len(texts) == 1:
                if texts[0] in automaton.root_passthrough:
                    return texts[0], 1, None
            elif automaton.root_passthrough.issuperset(texts):
                return "".join(texts), len(texts), None
        memo = automaton.memo
        released: list[str] = []
        for index, text in enumerate(texts):
            result = memo[state].get(text)
            if result is None:
                result = automaton.scan(state, text)
            end_state, out, match_end, pattern = result
            if match_end >= 0 and index >= checked_from:
                released.append(self._cut_at_match(state, text, match_end, pattern))
                return (
                    "".join(released),
                    index,
                    StopStringMatch(automaton.patterns[pattern], automaton.visible[pattern]),
                )
            state = end_state
            released.append(out)
        self.state = state
        return (released[0] if len(released) == 1 else "".join(released)), len(texts), None

    def release(self) -> str:
        """Release the held text (end of stream): it did not turn into a stop string."""
        held = self.held
        self.state = ROOT
        return held

    def _cut_at_match(self, state: int, text: str, match_end: int, pattern: int) -> str:
        """The text to release when `text`, fed in `state`, completes stop string `pattern`; the stream stops."""
        automaton = self._automaton
        held = automaton.held_text(state)
        end = len(held) + match_end
        self.state = ROOT
        return (held + text)[: end if automaton.visible[pattern] else end - len(automaton.patterns[pattern])]
