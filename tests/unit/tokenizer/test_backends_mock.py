"""The deterministic mock tokenizer: vocabulary layout, round trips, offsets, special tokens, chat template."""

from __future__ import annotations

import pytest
from helpers.tokenizer_files import MULTILINGUAL_TEXTS, assert_offsets_map_back

from detok_worker.tokenizer.backends.mock import MockTokenizer
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer


def test_vocabulary_layout_and_special_tokens() -> None:
    mock = MockTokenizer(words=["hello", " world"], specials=["<s>", "</s>"])
    assert isinstance(mock, Tokenizer)
    assert mock.vocab_size == 256 + 2 + 2
    assert mock.encode("hello world!").ids == [256, 257, ord("!")]
    assert mock.encode("é").ids == list("é".encode())
    assert mock.encode("hi</s>", add_special_tokens=True).ids == [258, ord("h"), ord("i"), 259]
    assert mock.special_tokens.bos == "<s>" and mock.special_tokens.eos == "</s>"
    assert mock.eos_token_ids == frozenset({259})
    assert mock.decode([258, 256, 259]) == "<s>hello</s>"
    assert mock.decode([258, 256, 259], skip_special_tokens=True) == "hello"


def test_deterministic_round_trip_and_offsets() -> None:
    first, second = MockTokenizer(), MockTokenizer()
    for text in MULTILINGUAL_TEXTS:
        encoding = first.encode(text)
        assert encoding.ids == second.encode(text).ids
        assert encoding.hash() == second.encode(text).hash()
        assert first.decode(encoding.ids) == text
        assert_offsets_map_back(first, text)


def test_token_strings_and_partial_characters() -> None:
    mock = MockTokenizer()
    for token_id in range(mock.vocab_size):
        assert mock.token_to_id(mock.id_to_token(token_id)) == token_id
    emoji_ids = mock.encode("🫨").ids
    assert len(emoji_ids) == 4
    assert mock.decode(emoji_ids[:3]) == "\ufffd"
    assert mock.decode(emoji_ids) == "🫨"
    with pytest.raises(InvalidTokenIdError):
        mock.decode([mock.vocab_size])


def test_chat_template() -> None:
    mock = MockTokenizer()
    prompt = mock.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert prompt == "<bos><|user|>hi\n<|assistant|>"
    assert mock.encode(prompt).ids[0] == mock.token_to_id("<bos>")
