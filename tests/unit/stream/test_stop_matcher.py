"""The text-level stop-string matcher, against a naive reference: find every occurrence, keep the earliest-ending."""

from __future__ import annotations

import pytest
from helpers.stop_checks import reference_hold
from hypothesis import given, settings
from hypothesis import strategies as st

from detok_worker.stream.stop.matcher import StopStringAutomaton, StopStringFilter, compile_stop_strings


def reference_stop(
    pieces: list[str], hidden: list[str], visible: list[str], checked_from: int = 0
) -> tuple[str, str | None]:
    """Naive model: join everything, find all matches ending after the unchecked pieces, earliest end (then
    earliest start) wins; hidden truncates before the match, visible after it."""
    text = "".join(pieces)
    boundary = len("".join(pieces[:checked_from]))
    best: tuple[tuple[int, int], str] | None = None
    for stop in [*hidden, *visible]:
        start = text.find(stop)
        while start >= 0:
            end = start + len(stop)
            if end > boundary and (best is None or (end, start) < best[0]):
                best = ((end, start), stop)
            start = text.find(stop, start + 1)
    if best is None:
        return text, None
    (end, start), stop = best
    return (text[:end] if stop in visible else text[:start]), stop


def run_filter(
    pieces: list[str], hidden: list[str], visible: list[str], checked_from: int = 0
) -> tuple[list[str], str | None]:
    """Feed piece by piece, checking the hold invariant after every piece; returns the released texts."""
    stop_filter = StopStringFilter(compile_stop_strings(tuple(hidden), tuple(visible)))
    outputs: list[str] = []
    fed = ""
    for index, piece in enumerate(pieces):
        released, match = stop_filter.feed_one(piece, index >= checked_from)
        outputs.append(released)
        if match is not None:
            return outputs, match.stop
        fed += piece
        assert stop_filter.held == reference_hold(fed, [*hidden, *visible])
        assert "".join(outputs) + stop_filter.held == fed
    outputs.append(stop_filter.release())
    return outputs, None


CASES = [
    # (pieces, hidden, visible, checked_from, expected text, expected stop)
    (["there"], ["re", "he"], [], 0, "t", "he"),
    (["t", "h", "e", "r", "e"], ["re", "he"], [], 0, "t", "he"),
    (["abc"], ["abc", "b"], [], 0, "a", "b"),
    (["abcd"], ["bcd", "abc"], [], 0, "", "abc"),
    (["xabcd"], ["bc", "abc"], [], 0, "x", "abc"),  # same end: the earlier start wins
    (["xabcd"], [], ["bc", "abc"], 0, "xabc", "abc"),
    (["hello", " wor", "ld"], [], ["o w"], 0, "hello w", "o w"),
    (["a</s", ">b"], ["</s>"], [], 0, "a", "</s>"),
    (["ab"], ["abc"], [], 0, "ab", None),
    (["aab"], ["ab"], [], 1, "aab", None),  # entirely inside the unchecked part
    (["a", "ab"], ["ab"], [], 1, "a", "ab"),
    (["xa", "b"], ["ab"], [], 1, "x", "ab"),  # starts before the boundary, ends after it
    (["ab", "ab"], ["ab"], [], 1, "ab", "ab"),
    (["日本語", "です"], ["語で"], [], 0, "日本", "語で"),
    (["👨\u200d👩", "\u200d👧"], ["👩\u200d👧"], [], 0, "👨\u200d", "👩\u200d👧"),
]


@pytest.mark.parametrize(("pieces", "hidden", "visible", "checked_from", "expected", "stop"), CASES)
def test_table(
    pieces: list[str], hidden: list[str], visible: list[str], checked_from: int, expected: str, stop: str | None
) -> None:
    assert reference_stop(pieces, hidden, visible, checked_from) == (expected, stop)
    outputs, found = run_filter(pieces, hidden, visible, checked_from)
    assert ("".join(outputs), found) == (expected, stop)


def test_hidden_prefix_is_held_and_released_when_match_diverges() -> None:
    outputs, found = run_filter(["Hello ", "</", "s", " and"], ["</s>"], [])
    assert outputs == ["Hello ", "", "", "</s and", ""]
    assert found is None


def test_hold_is_only_the_longest_live_prefix() -> None:
    stop_filter = StopStringFilter(compile_stop_strings(("abab",), ()))
    assert stop_filter.feed_one("xxaba") == ("xx", None)
    assert stop_filter.held == "aba"
    # "abaa": the only live prefix left is "a"
    assert stop_filter.feed_one("a") == ("aba", None)
    assert stop_filter.held == "a"


def test_automaton_is_shared_per_stop_set() -> None:
    assert compile_stop_strings(("a", "b"), ()) is compile_stop_strings(("a", "b"), ())
    assert compile_stop_strings(("a",), ()) is not compile_stop_strings((), ("a",))


def test_fifty_stop_strings() -> None:
    stops = [f"<stop{i:02d}>" for i in range(50)]
    automaton = StopStringAutomaton(stops, ())
    assert len(automaton.goto) == 2  # built lazily: the root and the one child "<" all fifty share
    assert automaton.scan(0, "<stop37>")[2:] == (8, 37)
    assert len(automaton.goto) < 1 + len("<stop") + 5 + 50 + 50  # only what the scan needed
    text = ["plain text ", "<sto", "p4", "x> more <stop", "37> never"]
    outputs, found = run_filter(text, stops, [])
    assert "".join(outputs) == "plain text <stop4x> more "
    assert found == "<stop37>"


def test_memo_gives_same_answers_after_clearing() -> None:
    automaton = StopStringAutomaton(("ab",), ())
    first = automaton.scan(0, "xxa")
    assert first == (automaton.goto[0]["a"], "xx", -1, -1)
    for i in range(10000):  # overflow the memo at least once
        automaton.scan(0, str(i))
    assert automaton.scan(0, "xxa") == first
    assert automaton.held_text(first[0]) == "a"


alphabet = st.sampled_from("abé😀\u200d")
stop_strings = st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=5, unique=True)


@settings(max_examples=400, deadline=None)
@given(
    stops=stop_strings,
    n_visible=st.integers(0, 5),
    pieces=st.lists(st.text(alphabet, max_size=5), max_size=10),
    checked_from=st.integers(0, 10),
)
def test_matches_reference(stops: list[str], n_visible: int, pieces: list[str], checked_from: int) -> None:
    visible, hidden = stops[:n_visible], stops[n_visible:]
    outputs, found = run_filter(pieces, hidden, visible, checked_from)
    assert ("".join(outputs), found) == reference_stop(pieces, hidden, visible, checked_from)
    # the batch entry point gives the same result
    stop_filter = StopStringFilter(compile_stop_strings(tuple(hidden), tuple(visible)))
    released, index, match = stop_filter.feed(pieces, checked_from)
    if match is None:
        released += stop_filter.release()
        assert index == len(pieces)
    else:
        assert index == len(outputs) - 1
    assert (released, match.stop if match else None) == reference_stop(pieces, hidden, visible, checked_from)


def test_deep_failure_chains_at_the_maxima() -> None:
    """1,024-character stop strings whose failure links chain all the way down (built lazily, without recursion)."""
    stops = ["a" * 1023 + "b", "a" * 1000 + "c", "ab" * 512]
    text = ["a" * 700, "a" * 400 + "c", "a" * 2000, "b tail"]
    outputs, found = run_filter(text, stops, [])
    joined = "".join(text)
    assert found == "a" * 1000 + "c"
    assert "".join(outputs) == joined[: joined.index("a" * 1000 + "c")]
    automaton = StopStringAutomaton(["a" * 1023 + "b"], ())
    state, released, match_end, _ = automaton.scan(0, "a" * 3000)
    assert (released, match_end, automaton.held_text(state)) == ("a" * 1977, -1, "a" * 1023)
    assert automaton.scan(state, "b")[2:] == (1, 0)
