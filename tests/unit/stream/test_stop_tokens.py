"""StopSequenceDecoder on real fixture tokenizers: stop tokens (hidden and visible) and min_tokens.

Expected outputs come from the naive reference model in test_stop_decoder.py.
"""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.stop_checks import TOKENIZERS, check, encode_pieces, single_token_pieces

from detok_worker.stream import Held, Stopped, StoppedWithText, StopSequenceConfig, StopSequenceDecoder, Text

# ---------------------------------------------------------------------------------------------------------------
# Stop tokens


def test_visible_stop_token_keeps_its_leading_space() -> None:
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    ids = tokenizer.encode("Hello world Stop here").ids
    stop_id = next(i for i in ids if tokenizer.id_to_token(i) == "▁Stop")
    assert tokenizer.decode([stop_id]) == "Stop"  # decoded on its own the space would be lost
    visible = check("mistral-sp-v1", ids, StopSequenceConfig(visible_stop_tokens=[stop_id]))
    assert (visible.text, visible.stop_reason) == ("Hello world Stop", stop_id)
    hidden = check("mistral-sp-v1", ids, StopSequenceConfig(stop_tokens=[stop_id]))
    assert (hidden.text, hidden.stop_reason) == ("Hello world", stop_id)


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
def test_hidden_stop_token_releases_held_text_but_not_its_own(tokenizer_name: str) -> None:
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    eos = min(tokenizer.eos_token_ids)
    ids = [*tokenizer.encode("Result <").ids, eos, *tokenizer.encode("after").ids]
    config = StopSequenceConfig(stop_tokens=[eos], stop_sequences=["<stop>"])
    decoder = StopSequenceDecoder(tokenizer, config)
    outputs = [decoder.process_token(i) for i in ids]
    eos_at = ids.index(eos)
    assert "".join(o.text for o in outputs[:eos_at]) == "Result "
    assert outputs[eos_at] == StoppedWithText("<", eos)
    assert all(o == Stopped(eos) for o in outputs[eos_at + 1 :])
    check(tokenizer_name, ids, config)


def test_stop_tokens_are_checked_before_strings() -> None:
    ids = encode_pieces(["Say ", "a", "b", "c"])
    b_id = ids[-2]
    for config, output in [
        (StopSequenceConfig(visible_stop_tokens=[b_id], stop_sequences=["ab"]), "Say ab"),
        (StopSequenceConfig(stop_tokens=[b_id], stop_sequences=["ab"]), "Say a"),
    ]:
        expected = check("qwen3", ids, config)
        assert (expected.text, expected.stop_reason) == (output, b_id)


@pytest.mark.parametrize("visible", [False, True])
def test_stop_token_after_an_incomplete_character(visible: bool) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    emoji_ids = tokenizer.encode("🫨").ids
    ids = [*tokenizer.encode("see ").ids, *emoji_ids]
    stop = [emoji_ids[-1]]
    config = StopSequenceConfig(visible_stop_tokens=stop) if visible else StopSequenceConfig(stop_tokens=stop)
    expected = check("qwen3", ids, config)
    # the text before the stop token ends inside the emoji: U+FFFD, as decode(ids before the stop token) gives
    assert (expected.text, expected.stop_reason) == (tokenizer.decode(ids[:-1]), emoji_ids[-1])
    assert expected.text.startswith("see \ufffd")


def test_stop_string_completed_by_text_before_a_visible_stop_token() -> None:
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    ids = tokenizer.encode("Say 𝄞 Stop").ids  # 𝄞 is four byte tokens; the stream withholds the run until it ends
    stop_id = ids[-1]
    assert tokenizer.id_to_token(stop_id) == "▁Stop"
    config = StopSequenceConfig(stop_sequences=["𝄞"], visible_stop_tokens=[stop_id])
    expected = check("mistral-sp-v1", ids, config)
    assert (expected.text, expected.stop_reason) == ("Say ", "𝄞")


# ---------------------------------------------------------------------------------------------------------------
# min_tokens


def test_min_tokens_straddling_stop_string_is_found() -> None:
    ids = single_token_pieces(["one", " two", " <", "|", "END", "|", ">", " three"])
    config = StopSequenceConfig(stop_sequences=["<|END|>"])
    for min_tokens in range(len(ids) + 2):
        expected = check("qwen3", ids, config, min_tokens=min_tokens)
        if min_tokens <= 6:  # the match starts in the 3rd token and ends in the 7th
            assert (expected.text, expected.stop_reason) == ("one two ", "<|END|>")
        else:
            assert (expected.text, expected.stop_reason) == ("one two <|END|> three", None)


def test_min_tokens_ignores_earlier_matches_but_finds_later_ones() -> None:
    ids = single_token_pieces(["a", " stop", " b", " stop", " c"])
    expected = check("qwen3", ids, StopSequenceConfig(stop_sequences=["stop"]), min_tokens=2)
    assert (expected.text, expected.stop_reason) == ("a stop b ", "stop")


def test_min_tokens_holds_hidden_prefix_while_unchecked() -> None:
    ids = single_token_pieces(["x", " <", "|", "END", "|", ">"])
    decoder = StopSequenceDecoder(
        load_fixture_tokenizer("qwen3"), StopSequenceConfig(stop_sequences=["<|END|>"]), min_tokens=3
    )
    outputs = [decoder.process_token(i) for i in ids]
    assert outputs == [Text("x"), Text(" "), Held(), Held(), Held(), Stopped("<|END|>")]


def test_min_tokens_applies_to_stop_tokens() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    eos = min(tokenizer.eos_token_ids)
    ids = [*tokenizer.encode("a").ids, eos, *tokenizer.encode(" b").ids, eos, *tokenizer.encode(" c").ids]
    config = StopSequenceConfig(stop_tokens=[eos])
    expected = check("qwen3", ids, config, min_tokens=2)
    assert (expected.text, expected.stop_reason) == ("a" + tokenizer.decode([eos]) + " b", eos)
