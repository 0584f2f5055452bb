"""The SentencePiece backend decodes as the sentencepiece library does, where that differs from Hugging Face's
conversion of the same model: byte pieces resolve to their longest valid UTF-8 text with one U+FFFD per byte that
cannot be part of a character, and a leading `<0x20>` byte piece stays a space. Checked on the v1, v3 and v7
models mistral-common ships, against sentencepiece itself on random byte-heavy ids, and against the Hugging Face
conversion (mistral-sp-v1) to show that the difference is real."""

from __future__ import annotations

import random
from pathlib import Path

import mistral_common
import pytest
import sentencepiece
from helpers.tokenizer_files import reference_hf_tokenizer

from detok_worker.tokenizer.backends.sentencepiece import SentencePieceTokenizer, load_sentencepiece

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
MODELS = {
    "v1": "tokenizer.model.v1",
    "v3": "mistral_instruct_tokenizer_240323.model.v3",
    "v7": "mistral_instruct_tokenizer_241114.model.v7",
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request: pytest.FixtureRequest) -> tuple[SentencePieceTokenizer, sentencepiece.SentencePieceProcessor]:
    path = MISTRAL_DATA / MODELS[request.param]
    return load_sentencepiece(path), sentencepiece.SentencePieceProcessor(model_file=str(path))


def _byte_id(reference: sentencepiece.SentencePieceProcessor, value: int) -> int:
    token_id = reference.piece_to_id(f"<0x{value:02X}>")
    assert reference.is_byte(token_id)
    return token_id


def test_invalid_byte_runs_keep_their_valid_characters(pair) -> None:
    ours, reference = pair
    hiragana_a_then_stray = [_byte_id(reference, b) for b in (0xE3, 0x81, 0x82, 0x80)]
    assert ours.decode(hiragana_a_then_stray) == reference.decode(hiragana_a_then_stray) == "あ\ufffd"
    emoji_then_stray = [_byte_id(reference, b) for b in (0xF0, 0x9F, 0x98, 0x80, 0x80)]
    assert ours.decode(emoji_then_stray) == reference.decode(emoji_then_stray) == "😀\ufffd"


def test_leading_space_byte_piece_is_kept(pair) -> None:
    ours, reference = pair
    word = reference.piece_to_id("▁a")
    ids = [_byte_id(reference, 0x20), word]
    assert ours.decode(ids) == reference.decode(ids) == "  a"
    ids = [_byte_id(reference, 0x20), _byte_id(reference, 0x41)]
    assert ours.decode(ids) == reference.decode(ids) == " A"


def test_random_byte_heavy_ids_decode_as_sentencepiece(pair) -> None:
    ours, reference = pair
    rng = random.Random(7)
    byte_ids = [i for i in range(reference.vocab_size()) if reference.is_byte(i)]
    text_ids = [i for i in range(reference.vocab_size()) if not reference.is_control(i) and not reference.is_byte(i)]
    with_replacement = 0
    for _ in range(2000):
        ids = [rng.choice(byte_ids) if rng.random() < 0.7 else rng.choice(text_ids) for _ in range(rng.randint(1, 9))]
        expected = reference.decode(ids)
        assert ours.decode(ids) == expected, ids
        assert ours.decode(ids, skip_special_tokens=True) == expected, ids
        with_replacement += "\ufffd" in expected
    assert with_replacement > 500  # invalid byte runs, where sentencepiece and Hugging Face differ, are common


def test_hugging_face_conversion_differs_on_the_same_ids() -> None:
    """The behaviour pinned above is sentencepiece's, not Hugging Face's (so the docstring must not claim HF)."""
    ours = load_sentencepiece(MISTRAL_DATA / MODELS["v1"])
    hf = reference_hf_tokenizer("mistral-sp-v1")
    run = [ours.token_to_id(f"<0x{b:02X}>") for b in (0xE3, 0x81, 0x82, 0x80)]
    assert hf.decode(run, skip_special_tokens=False) == "\ufffd" * 4 != ours.decode(run)
    leading = [ours.token_to_id("<0x20>"), ours.token_to_id("▁a")]
    assert hf.decode(leading, skip_special_tokens=False) == " a" != ours.decode(leading)
