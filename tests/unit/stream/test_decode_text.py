"""decode_text (detok_worker/stream/decode/select.py): exactly the tokenizer's decode, and with tables read from
the disk cache it gives it without building the library tokenizer (what a worker started from a warm cache has)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, TEXT_DECODER_FIXTURE_DIRS
from helpers.tokenizer_files import MULTILINGUAL_TEXTS

from detok_worker.stream.decode import byte_decoding_for, decode_text
from detok_worker.tokenizer import InvalidTokenIdError, create_tokenizer
from detok_worker.tokenizer.loading import load_cache


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(load_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_decode_text_is_decode_and_needs_no_library_build_after_a_warm_start(cache_root: Path) -> None:
    cold = create_tokenizer(FIXTURE_TOKENIZER_DIRS["qwen3"])
    assert byte_decoding_for(cold) is not None  # verified, and written to the disk cache
    rng = random.Random(7)
    texts = [cold.encode(text).ids for text in MULTILINGUAL_TEXTS]
    special = sorted(cold.special_token_ids)
    sequences = [
        *texts,
        *[[i] for i in rng.sample(range(cold.vocab_size), 300) + special],
        *[[rng.randrange(cold.vocab_size) for _ in range(12)] + rng.sample(special, 2) for _ in range(50)],
        [ids[0] for ids in texts if ids] + texts[0][1:],
        [],
    ]
    want = {skip: [cold.decode(ids, skip) for ids in sequences] for skip in (False, True)}
    warm = create_tokenizer(FIXTURE_TOKENIZER_DIRS["qwen3"])
    assert byte_decoding_for(warm) is not None
    for skip in (False, True):
        assert [decode_text(warm, ids, skip) for ids in sequences] == want[skip]
    assert "_tokenizer" not in vars(warm)
    with pytest.raises(InvalidTokenIdError):
        decode_text(warm, [1, warm.vocab_size])


def test_without_verified_tables_it_is_the_tokenizers_decode() -> None:
    tokenizer = create_tokenizer(TEXT_DECODER_FIXTURE_DIRS["bert-wordpiece"])
    assert byte_decoding_for(tokenizer) is None
    ids = tokenizer.encode("Hello, world! Streaming detokenization.").ids
    assert decode_text(tokenizer, ids) == tokenizer.decode(ids) != ""
