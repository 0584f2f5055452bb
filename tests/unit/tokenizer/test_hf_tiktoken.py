"""Prompt encoding through tiktoken (backends/hf_tiktoken.py): for the tokenizer.json files it takes (Qwen3, gpt-oss)
the ids and offsets of every text equal the `tokenizers` library's, through HFTokenizer.encode with and without
added special tokens; the files it cannot encode the same way are left to the library, and so are texts it cannot
take as they are."""

from __future__ import annotations

import json
import random

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.texts import load_texts
from tokenizers import Tokenizer as RustTokenizer

from detok_worker.tokenizer.backends.hf import HFTokenizer
from detok_worker.tokenizer.backends.hf_tiktoken import TiktokenEncoder

TAKEN = ["qwen3", "gpt-oss"]
# characters where regex engines and normalizers disagree most: whitespace of every kind, combining marks, digits
# of other scripts, emoji sequences, CJK, full-width forms, ligatures, right-to-left scripts
ALPHABET = [
    *map(chr, range(32, 127)), "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\xa0", "\u1680", "\u2028",
    "\u3000", "\u200b", "\ufeff", "é", "\u0301", "\u0308", "ñ", "ß", "İ", "中", "文", "日", "本", "語", "한", "ア",
    "😀", "👩", "\U0001f3fd", "\u200d", "💻", "🇫", "🇷", "Ａ", "ﬁ", "Ⅻ", "²", "٣", "१", "𝟘", "א", "ا", "क", "्",
    "\uf981", "\u212a", "\u2126", "\u0343", "\u0344",  # NFC changes these one for one (U+0344: into two)
]  # fmt: skip


def random_texts(tokenizer: HFTokenizer, count: int, seed: int) -> list[str]:
    """Corpus slices and strings of ALPHABET and the tokenizer's added tokens (whole, or cut short)."""
    rng = random.Random(seed)
    corpus = "\n\n".join(load_texts().values())
    added = list(tokenizer.added_token_contents().values())
    pieces = [*ALPHABET, *rng.sample(added, min(12, len(added)))]
    pieces += [token[: rng.randrange(1, len(token))] for token in rng.sample(added, min(6, len(added)))]
    texts = []
    for _ in range(count):
        if rng.random() < 0.2:
            start = rng.randrange(len(corpus))
            texts.append(corpus[start : start + rng.randrange(1, 3000)])
        else:
            texts.append("".join(rng.choice(pieces) for _ in range(rng.randrange(1, 80))))
    return texts


def library_encoding(tokenizer: HFTokenizer, text: str, add_special_tokens: bool) -> tuple[list[int], list]:
    encoding = tokenizer.hf_tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return encoding.ids, [tuple(span) for span in encoding.offsets]


@pytest.mark.parametrize("name", TAKEN)
def test_ids_and_offsets_are_the_librarys_on_random_texts(name: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    encoder = tokenizer.build_tiktoken_encoder()  # HFTokenizer.encode takes it from now on
    assert encoder is not None
    compared = 0
    for index, text in enumerate(random_texts(tokenizer, 1200, seed=len(name))):
        add_special = index % 2 == 0
        expected = library_encoding(tokenizer, text, add_special)
        got = tokenizer.encode(text, add_special_tokens=add_special)
        assert (got.ids, [tuple(span) for span in got.offsets]) == expected, repr(text)
        fast = encoder.encode(text)
        if fast is not None:
            compared += 1
            assert (fast.ids, fast.offsets) == library_encoding(tokenizer, text, False), repr(text)
    assert compared > 700  # the texts whose NFC form composes characters go to the library


@pytest.mark.parametrize("name", TAKEN)
def test_ids_alone_are_the_librarys_also_where_nfc_composes(name: str) -> None:
    """encode_ids takes every text, those whose NFC form composes or splits characters too (encode leaves those to
    the library: their offsets would need aligning): the ids equal the library's."""
    tokenizer = load_fixture_tokenizer(name)
    encoder = tokenizer.build_tiktoken_encoder()
    assert encoder is not None
    composing = 0
    for index, text in enumerate(random_texts(tokenizer, 1200, seed=len(name) + 7)):
        add_special = index % 2 == 0
        expected = tokenizer.hf_tokenizer.encode(text, add_special_tokens=add_special).ids
        assert tokenizer.encode_ids(text, add_special_tokens=add_special) == expected, repr(text)
        fast = encoder.encode_ids(text)
        assert fast == tokenizer.hf_tokenizer.encode(text, add_special_tokens=False).ids, repr(text)
        composing += encoder.encode(text) is None
    assert composing > 200 if name == "qwen3" else composing == 0  # gpt-oss has no normalizer


def test_nfc_changing_characters_one_for_one_is_taken_and_composing_is_left_to_the_library() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    encoder = TiktokenEncoder.build(tokenizer.hf_tokenizer)
    assert encoder is not None
    decomposed = "cafe\u0301 and re\u0301sume\u0301"
    assert encoder.encode(decomposed) is None
    assert encoder.encode_ids(decomposed) == library_encoding(tokenizer, decomposed, False)[0]
    got = tokenizer.encode(decomposed)
    assert (got.ids, [tuple(span) for span in got.offsets]) == library_encoding(tokenizer, decomposed, False)
    assert got.ids == tokenizer.encode("café and résumé").ids  # NFC composed it
    compatibility = "<|im_start|>\uf981 5\u212a 1\u2126 \u0343<|im_end|>"  # 女, K, Ω, U+0313
    fast = encoder.encode(compatibility)
    assert fast is not None and (fast.ids, fast.offsets) == library_encoding(tokenizer, compatibility, False)
    assert fast.ids == encoder.encode("<|im_start|>女 5K 1Ω \u0313<|im_end|>").ids  # type: ignore[union-attr]


def test_added_tokens_split_the_text_leftmost_longest() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    encoder = TiktokenEncoder.build(tokenizer.hf_tokenizer)
    assert encoder is not None
    text = "<|im_start|>user\n<think></think><tool_call><|im_end|><|im_end><|im_start|>"
    got = encoder.encode(text)
    assert got is not None and (got.ids, got.offsets) == library_encoding(tokenizer, text, False)
    assert got.ids[0] == tokenizer.token_to_id("<|im_start|>") and got.offsets[0] == (0, 12)


def test_of_added_tokens_that_start_alike_the_longest_splits_the_text() -> None:
    library = load_fixture_tokenizer("qwen3").hf_tokenizer
    spec = json.loads(library.to_str())
    next_id = max(token["id"] for token in spec["added_tokens"]) + 1
    for offset, content in enumerate(["<x>", "<x>y", "<x>yz"]):
        flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        spec["added_tokens"].append({"id": next_id + offset, "content": content, **flags})
    overlapping = RustTokenizer.from_str(json.dumps(spec))
    encoder = TiktokenEncoder.build(overlapping)
    assert encoder is not None
    for text in ["<x>yz<x>y<x>", "a<x>y<x>yzz<x", "<x>yy<x>"]:
        expected = overlapping.encode(text, add_special_tokens=False)
        got = encoder.encode(text)
        assert got is not None and (got.ids, got.offsets) == (expected.ids, [tuple(s) for s in expected.offsets])


@pytest.mark.parametrize("name", ["deepseek-v3", "claude", "mistral-sp-v1"])
def test_tokenizers_of_another_shape_are_left_to_the_library(name: str) -> None:
    # DeepSeek-V3: several Splits; Claude: NFKC and ByteLevel's own regex; Mistral: SentencePiece byte fallback
    assert TiktokenEncoder.build(load_fixture_tokenizer(name).hf_tokenizer) is None


def doctored(change: str) -> RustTokenizer:
    spec = json.loads(load_fixture_tokenizer("qwen3").hf_tokenizer.to_str())
    if change == "merges out of id order":
        merges = spec["model"]["merges"]
        merges[100], merges[200] = merges[200], merges[100]
    elif change == "a token no merge makes":
        del spec["model"]["merges"][5000]
    elif change == "a pattern that leaves text between its matches":
        spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\p{L}+"
    return RustTokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize(
    "change", ["merges out of id order", "a token no merge makes", "a pattern that leaves text between its matches"]
)
def test_a_tokenizer_tiktoken_would_encode_differently_is_left_to_the_library(change: str) -> None:
    assert TiktokenEncoder.build(doctored(change)) is None
