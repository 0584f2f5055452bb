"""The front's RequestStream goes through the one reassembly rule: re-sent text once, a gap fails the request."""

from __future__ import annotations

from detok_worker.bus.messages import DetokParams, LogprobText, TextDelta
from detok_worker.bus.reassembly import GAP_ERROR
from detok_worker.front.request_stream import RequestStream
from detok_worker.stream.stop.rules import StopLimits, StopRules


def make_stream() -> RequestStream:
    rules = StopRules.from_params(DetokParams(stop=["###"]), StopLimits(), eos_ids=[2])
    return RequestStream("r", prompt_tokens=3, deadline=1e18, stop_rules=rules)


def test_resent_text_is_delivered_once_and_eos_is_a_null_stop_reason() -> None:
    stream = make_stream()
    assert stream.accept(TextDelta("r", 0, "Hello", 1)) == "Hello"
    assert stream.accept(TextDelta("r", 0, "Hello, wo", 3)) == ", wo"  # a re-open replays from 0
    assert stream.accept(TextDelta("r", 9, "rld", 4, finish="stop", stop_reason=2)) == "rld"
    assert (stream.done, stream.finish, stream.stop_reason, stream.failure) == (True, "stop", None, None)
    assert stream.reassembly.duplicate_chars == 5


def test_a_gap_fails_the_stream_and_keeps_only_text_in_place() -> None:
    stream = make_stream()
    assert stream.accept(TextDelta("r", 0, "ab", 1)) == "ab"
    assert stream.accept(TextDelta("r", 4, "ef", 2)) is None
    assert stream.done and stream.failure is not None
    assert (stream.failure.status, stream.failure.message) == (502, GAP_ERROR)
    assert "".join(stream._pieces) == "ab"


def _entry(token: str) -> LogprobText:
    return LogprobText(token, token.encode(), -1.0)


def test_resent_logprobs_are_delivered_once_by_token_index() -> None:
    stream = make_stream()
    stream.accept(TextDelta("r", 0, "Hel", 2, logprobs=[_entry("He"), _entry("l")]))
    assert [entry.token for entry in stream.take_logprobs()] == ["He", "l"]
    # a re-open replays from token 0; held entries arrive with the later text
    stream.accept(TextDelta("r", 0, "Hello", 3, logprobs=[_entry("He"), _entry("l"), _entry("lo")]))
    stream.accept(TextDelta("r", 5, "!", 5, finish="length", logprobs=[_entry("\ufffd"), _entry("!")]))
    assert [entry.token for entry in stream.take_logprobs()] == ["lo", "\ufffd", "!"]
    assert stream.logprob_entries.delivered == 5 == stream.n_tokens and stream.failure is None


def test_a_logprobs_gap_fails_the_stream() -> None:
    stream = make_stream()
    stream.accept(TextDelta("r", 0, "a", 1, logprobs=[_entry("a")]))
    assert stream.accept(TextDelta("r", 1, "b", 3, logprobs=[_entry("b")])) is None  # token 1 never came
    assert stream.failure is not None and stream.failure.message == GAP_ERROR


def test_resent_token_ids_are_delivered_once_by_token_index() -> None:
    """return_token_ids: the ids follow the logprobs' rule (a delta's ids are of tokens n_tokens - len(ids) on)."""
    stream = make_stream()
    stream.accept(TextDelta("r", 0, "Hel", 2, token_ids=[10, 11]))
    assert stream.take_token_ids() == [10, 11]
    stream.accept(TextDelta("r", 0, "Hello", 3, token_ids=[10, 11, 12]))  # a re-open replays from token 0
    stream.accept(TextDelta("r", 5, "", 4, token_ids=[13]))  # a token whose text is held
    stream.accept(TextDelta("r", 5, "!", 5, finish="length", token_ids=[14]))
    assert stream.take_token_ids() == [12, 13, 14]
    assert stream.token_id_entries.delivered == 5 == stream.n_tokens and stream.failure is None
    gapped = make_stream()
    gapped.accept(TextDelta("r", 0, "a", 1, token_ids=[10]))
    assert gapped.accept(TextDelta("r", 1, "b", 3, token_ids=[12])) is None  # token 1's id never came
    assert gapped.failure is not None and gapped.failure.message == GAP_ERROR
