"""Tekken with skip_special_tokens=True decodes and streams as mistral-common's IGNORE policy.

mistral-common, the tokenizer's own library, is the reference: it decodes each run of ordinary tokens between
special tokens on its own, so a skipped special token still ends the text before it. `[1227, 1129, 3, 1130]` are the
bytes E3 81 | [INST] | 82 ("あ" split by a special token): mistral-common gives two U+FFFD, not "あ". Checked on both
Tekken files mistral-common ships (240718, 240911), for decode and for both streaming paths."""

from __future__ import annotations

import random
from pathlib import Path

import mistral_common
import pytest
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
from mistral_common.tokens.tokenizers.tekken import Tekkenizer

from detok_worker.stream import DecodeStream, fast_path_status
from detok_worker.tokenizer.backends.mistral import TekkenTokenizer

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
SPLIT_HIRAGANA_A = [1227, 1129, 3, 1130]


@pytest.fixture(scope="module", params=["tekken_240718.json", "tekken_240911.json"])
def pair(request: pytest.FixtureRequest) -> tuple[TekkenTokenizer, Tekkenizer]:
    path = MISTRAL_DATA / request.param
    return TekkenTokenizer(path), Tekkenizer.from_file(str(path))


def _policy(skip: bool) -> SpecialTokenPolicy:
    return SpecialTokenPolicy.IGNORE if skip else SpecialTokenPolicy.KEEP


def test_split_character_decodes_as_mistral_common(pair) -> None:
    ours, reference = pair
    assert [reference.id_to_byte_piece(i, SpecialTokenPolicy.KEEP) for i in SPLIT_HIRAGANA_A] == [
        b"\xe3",
        b"\x81",
        b"[INST]",
        b"\x82",
    ]
    assert ours.decode(SPLIT_HIRAGANA_A, skip_special_tokens=True) == "\ufffd\ufffd"
    assert reference.decode(SPLIT_HIRAGANA_A, SpecialTokenPolicy.IGNORE) == "\ufffd\ufffd"
    assert ours.decode(SPLIT_HIRAGANA_A) == reference.decode(SPLIT_HIRAGANA_A, SpecialTokenPolicy.KEEP)


def _random_ids(rng: random.Random, ours: TekkenTokenizer) -> list[int]:
    n_special = 1000 if ours.vocab_size > 1000 else 0
    pools = [range(0, 20), range(n_special, n_special + 256), range(n_special + 256, ours.vocab_size)]
    return [rng.choice(pools[rng.randrange(3)]) for _ in range(rng.randint(1, 12))]


def test_random_ids_decode_as_mistral_common(pair) -> None:
    ours, reference = pair
    assert ours.special_token_ids == frozenset(range(reference.num_special_tokens))
    rng = random.Random(12)
    for _ in range(3000):
        ids = _random_ids(rng, ours)
        for skip in (False, True):
            assert ours.decode(ids, skip) == reference.decode(ids, _policy(skip)), (ids, skip)


@pytest.mark.parametrize("force_generic", [False, True])
def test_streams_give_mistral_common_ignore_decode(pair, force_generic: bool) -> None:
    ours, reference = pair
    assert fast_path_status(ours).decoding is not None  # the byte-level fast path is kept
    stream = DecodeStream(ours, [], True, force_generic=force_generic)
    steps = [stream.step(i) for i in SPLIT_HIRAGANA_A]
    if not force_generic:  # the fast path knows the U+FFFD before a skipped special token is final at once
        assert steps == [None, None, "\ufffd", "\ufffd"]
    assert "".join(s or "" for s in steps) + (stream.flush() or "") == "\ufffd\ufffd"
    rng = random.Random(6)
    for _ in range(400):
        ids = _random_ids(rng, ours)
        cut = rng.randrange(len(ids))
        expected = reference.decode(ids, SpecialTokenPolicy.IGNORE)
        prompt_text = reference.decode(ids[:cut], SpecialTokenPolicy.IGNORE)
        stream = DecodeStream(ours, ids[:cut], True, force_generic=force_generic)
        streamed = "".join(stream.step_batch(ids[cut:])) + (stream.flush() or "")
        assert streamed == expected[len(prompt_text) :], (ids, cut)
