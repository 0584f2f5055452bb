"""StopSequenceDecoder on real fixture tokenizers: every stop-string rule (hidden or
visible, min_tokens, the earliest end wins), checked step by step.

Expected outputs come from a naive reference model (decode the whole text, find the earliest-ending stop after
the min_tokens boundary, truncate), never from the decoder itself. After every step the tests also check that
the text released so far is a prefix of the final output (nothing that is later cut ever leaks) and that only
the longest possible start of a stop string is held back (nothing else is late).
"""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.stop_checks import (
    TOKENIZERS,
    check,
    encode_pieces,
    single_token_pieces,
)

from detok_worker.stream import (
    Held,
    Stopped,
    StopSequenceConfig,
    StopSequenceDecoder,
    Text,
)

# ---------------------------------------------------------------------------------------------------------------
# Stop strings


TABLE = [
    # (text, hidden stops, visible stops, expected output, expected stop)
    ("there", ["re", "he"], [], "t", "he"),
    ("abc", ["abc", "b"], [], "a", "b"),
    ("Hello world. Bye", ["world"], [], "Hello ", "world"),
    ("Hello world. Bye", [], ["world"], "Hello world", "world"),
    ("Hello world. Bye", ["orld. B", "ld"], [], "Hello wor", "ld"),
    ("Hello world. Bye", ["xyz"], [], "Hello world. Bye", None),
    ("a</s", ["</s>"], [], "a</s", None),  # a held partial match is released at the end
    ("日本語のテキストです", ["テキ"], [], "日本語の", "テキ"),
    ("emoji 🫨 here", ["🫨"], [], "emoji ", "🫨"),
    ("family 👨\u200d👩\u200d👧 ok", ["👩"], [], "family 👨\u200d", "👩"),
    ("flag 🇯🇵 ok", [], ["🇯"], "flag 🇯", "🇯"),
]


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
@pytest.mark.parametrize(("text", "hidden", "visible", "output", "stop"), TABLE)
def test_stop_string_table(
    tokenizer_name: str, text: str, hidden: list[str], visible: list[str], output: str, stop: str | None
) -> None:
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    ids = tokenizer.encode(text).ids
    config = StopSequenceConfig(stop_sequences=hidden, visible_stop_sequences=visible)
    expected = check(tokenizer_name, ids, config)
    assert (expected.text, expected.stop_reason) == (output, stop)


@pytest.mark.parametrize(("stop", "last_piece"), [("<|END", 2), ("<|END|>", 4)])
def test_hidden_stop_over_several_tokens_never_leaks(stop: str, last_piece: int) -> None:
    head = encode_pieces(["Answer: 42"])
    ids = [*head, *single_token_pieces([" <", "|", "END", "|", ">", " trailing"])]
    config = StopSequenceConfig(stop_sequences=[stop])
    decoder = StopSequenceDecoder(load_fixture_tokenizer("qwen3"), config)
    outputs = [decoder.process_token(i) for i in ids]
    stop_at = len(head) + last_piece
    held = [Held()] * (last_piece - 1)
    assert outputs[len(head) : stop_at] == [Text(" "), *held]  # from "<" on, no fragment of the stop leaks
    assert "".join(o.text for o in outputs[: len(head)]) == "Answer: 42"
    assert outputs[stop_at:] == [Stopped(stop)] * (len(ids) - stop_at)
    assert decoder.flush() == Stopped(stop)
    check("qwen3", ids, config)


def test_held_text_is_released_as_soon_as_the_match_diverges() -> None:
    ids = single_token_pieces(["Hello", " <", "|", "EN", "X", " more"])
    config = StopSequenceConfig(stop_sequences=["<|END|>"])
    decoder = StopSequenceDecoder(load_fixture_tokenizer("qwen3"), config)
    outputs = [decoder.process_token(i) for i in ids]
    assert outputs == [Text("Hello"), Text(" "), Held(), Held(), Text("<|ENX"), Text(" more")]
    check("qwen3", ids, config)


def test_flush_releases_a_held_partial_match() -> None:
    ids = encode_pieces(["The end", " <", "|", "EN"])
    decoder = StopSequenceDecoder(load_fixture_tokenizer("qwen3"), StopSequenceConfig(stop_sequences=["<|END|>"]))
    released = "".join(decoder.process_token(i).text for i in ids)
    assert released == "The end "
    assert decoder.flush() == Text("<|EN")
    assert not decoder.stopped


def test_stop_string_in_text_released_only_by_flush() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    emoji_ids = tokenizer.encode("🫨").ids
    assert len(emoji_ids) == 3
    ids = tokenizer.encode("ab").ids + emoji_ids[:2]  # ends inside a character: flush turns it into U+FFFD
    config = StopSequenceConfig(stop_sequences=["b\ufffd"])
    decoder = StopSequenceDecoder(tokenizer, config)
    assert "".join(decoder.process_token(i).text for i in ids) == "a"
    assert decoder.flush() == Stopped("b\ufffd")
    check("qwen3", ids, config)


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
def test_stop_inside_multibyte_characters(tokenizer_name: str) -> None:
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    text = "x🫨y 👨\u200d👩\u200d👧 日本語"
    ids = tokenizer.encode(text).ids
    assert len(ids) > len(text)  # the emoji really are split over several tokens
    for stop in ["🫨", "x🫨", "🫨y", "\u200d👧", "👧 日", "本"]:
        cut = text.index(stop)
        hidden = check(tokenizer_name, ids, StopSequenceConfig(stop_sequences=[stop]))
        assert (hidden.text, hidden.stop_reason) == (text[:cut], stop)
        visible = check(tokenizer_name, ids, StopSequenceConfig(visible_stop_sequences=[stop]))
        assert (visible.text, visible.stop_reason) == (text[: cut + len(stop)], stop)


def test_fifty_stop_strings() -> None:
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo"]
    stops = [f"{words[i % len(words)]}{i}" for i in range(50)]
    text = "We talk about alpha and alpha4 and echo and kilo10 in foxtrot5 the end"
    ids = load_fixture_tokenizer("qwen3").encode(text).ids
    expected = check("qwen3", ids, StopSequenceConfig(stop_sequences=stops))
    assert (expected.text, expected.stop_reason) == ("We talk about alpha and alpha4 and echo and ", "kilo10")
