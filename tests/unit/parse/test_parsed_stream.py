"""Reasoning and tool-call parsing through a real worker, on real model outputs of each family tokenized with
the fixture tokenizers: id by id, in random TokenBatch splits and across a worker loss, the channels a front
reassembles equal the parser applied to the whole decode, and the expected split."""

from __future__ import annotations

import random

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.parse_cases import CASES, OutputCase, calls_of, case_ids, random_splits, stream_case, whole_parse


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_streamed_channels_equal_the_whole_parse(case: OutputCase) -> None:
    tokenizer = load_fixture_tokenizer(case.tokenizer)
    _, ids = case_ids(tokenizer, case)
    one_by_one = stream_case(tokenizer, case, [1] * len(ids))
    assert (one_by_one.total.reasoning, one_by_one.total.content) == (case.reasoning, case.content)
    assert calls_of(one_by_one.total) == case.tool_calls
    assert one_by_one.last is not None
    assert (one_by_one.last.finish, one_by_one.last.stop_reason or None) == (
        case.finish,
        case.stop_reason or one_by_one.last.stop_reason,
    )
    if not case.stop:
        assert one_by_one.total == whole_parse(tokenizer, case)
    # markers never reach a channel, even when a marker's tokens arrive one by one
    for piece in one_by_one.pieces:
        markers = ("<think>", "</think>", "<tool_call>", "<|channel|>", "<|message|>", "[TOOL_CALLS]", "[ARGS]")
        for marker in (
            *markers,
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>",
            "<｜tool▁sep｜>",
            "<｜tool▁call▁end｜>",
            "<function=",
            "<parameter",
            "<arg_key>",
            "<arg_value>",
            "<minimax:tool_call>",
            "<invoke name=",
            "<|tool_calls_section_begin|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "Here is my thought process:",
        ):
            if marker not in case.content + case.reasoning:
                assert marker not in piece.content + piece.reasoning
    rng = random.Random(case.name)
    for _ in range(12):
        split = stream_case(tokenizer, case, random_splits(len(ids), rng))
        assert split.total == one_by_one.total
        assert split.last is not None and split.last.finish == one_by_one.last.finish


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_reopened_request_delivers_each_channel_once(case: OutputCase) -> None:
    tokenizer = load_fixture_tokenizer(case.tokenizer)
    _, ids = case_ids(tokenizer, case)
    reference = stream_case(tokenizer, case, [1] * len(ids)).total
    rng = random.Random(f"reopen-{case.name}")
    for _ in range(6):
        sizes = random_splits(len(ids), rng)
        if len(sizes) < 2:
            continue
        received = stream_case(tokenizer, case, sizes, reopen_after=rng.randrange(1, len(sizes)))
        assert received.total == reference


def test_tool_call_stream_shape() -> None:
    """The first piece of each call names it; the argument fragments concatenate to the exact JSON."""
    case = CASES[0]
    tokenizer = load_fixture_tokenizer(case.tokenizer)
    _, ids = case_ids(tokenizer, case)
    received = stream_case(tokenizer, case, [1] * len(ids))
    call_pieces = [call for piece in received.pieces for call in piece.tool_calls]
    assert call_pieces[0].name == "get_weather"
    assert all(not call.name for call in call_pieces[1:])
    assert len(call_pieces) > 5  # the arguments really stream
    assert "".join(call.arguments for call in call_pieces) == '{"city": "Paris", "unit": "celsius"}'
