"""The exactly-once delta rule (bus/reassembly.py) on its own: re-sent text, entries and parsed channels are dropped
by offset or token index, anything that starts past what was delivered is a gap. (Through the front's
RequestStream: tests/unit/front/test_request_stream.py.)"""

from __future__ import annotations

from detok_worker.bus.messages import ParsedDelta, TextDelta, ToolCallDelta
from detok_worker.bus.reassembly import DeltaReassembly, ParsedReassembly, TokenEntries


def test_text_is_delivered_once_by_offset() -> None:
    reassembly = DeltaReassembly()
    assert reassembly.take(TextDelta("r", 0, "Hello", 1)) == "Hello"
    assert reassembly.take(TextDelta("r", 0, "Hello, wo", 3)) == ", wo"  # a re-open replays from 0
    assert reassembly.take(TextDelta("r", 5, ", wo", 3)) == ""  # all of it delivered already
    assert (reassembly.delivered, reassembly.duplicate_chars, reassembly.gap) == (9, 9, False)
    assert reassembly.take(TextDelta("r", 10, "x", 4)) is None  # character 9 never came
    assert reassembly.gap


def test_entries_are_delivered_once_by_token_index() -> None:
    entries = TokenEntries()
    assert entries.take([10, 11], 2) == [10, 11]
    assert entries.take([10, 11, 12], 3) == [12]  # a re-open replays from token 0
    assert entries.take([12], 3) == []  # re-sent alone: nothing new
    assert entries.take([14], 5) is None  # token 3's entry never came
    assert entries.delivered == 3


def test_parsed_channels_are_delivered_once_each() -> None:
    reassembly = ParsedReassembly()
    first = ParsedDelta("Hi", 0, "hm", 0, [ToolCallDelta(0, "f", '{"a"', 0)])
    assert reassembly.take(first) == first
    again = ParsedDelta("Hi!", 0, "hm", 0, [ToolCallDelta(0, "f", '{"a": 1}', 0)])
    assert reassembly.take(again) == ParsedDelta("!", 0, "", 0, [ToolCallDelta(0, "", ": 1}", 0)])
    assert reassembly.take(ParsedDelta("x", 9)) is None and reassembly.gap  # content past what was delivered


def test_arguments_of_a_call_whose_name_never_came_are_a_gap() -> None:
    reassembly = ParsedReassembly()
    assert reassembly.take(ParsedDelta("", 0, tool_calls=[ToolCallDelta(1, "", "{}", 0)])) is None
    assert reassembly.gap


def test_a_calls_model_id_comes_once_with_its_name_and_survives_a_reopen() -> None:
    """A re-opened worker re-sends the call from its first piece, the model's id with its name: delivered once."""
    reassembly = ParsedReassembly()
    first = ParsedDelta("", 0, tool_calls=[ToolCallDelta(0, "f", '{"a"', 0, "functions.f:0")])
    assert reassembly.take(first) == first
    again = ParsedDelta("", 0, tool_calls=[ToolCallDelta(0, "f", '{"a": 1}', 0, "functions.f:0")])
    assert reassembly.take(again) == ParsedDelta("", 0, tool_calls=[ToolCallDelta(0, "", ": 1}", 0)])
    fresh = ParsedReassembly()  # a front that first hears of the call from the re-opened worker
    assert fresh.take(again) == again
