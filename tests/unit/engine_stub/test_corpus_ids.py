"""The corpus source's passage ids on disk (`passage_ids`): a hit gives exactly the
ids an encode gives, without building the library tokenizer; another tokenizer file or another corpus text misses."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import pytest

from detok_worker.tokenizer import DEFAULT_TOKENIZER_DIR, create_tokenizer
from detok_worker.tokenizer.loading import load_cache
from engine_stub import planned
from engine_stub.planned import load_corpus


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(load_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cached_passage_ids_equal_a_fresh_encode_and_need_no_library_build(cache_root: Path) -> None:
    passages = load_corpus()
    cold = create_tokenizer(DEFAULT_TOKENIZER_DIR)
    encoded = [cold.encode(passage).ids for passage in passages]
    assert planned.passage_ids(cold, passages) == encoded
    assert len(list((cache_root / "corpus-ids").glob("*.json"))) == 1
    warm = create_tokenizer(DEFAULT_TOKENIZER_DIR)  # facts from the load cache: library build deferred
    assert "_tokenizer" not in vars(warm)
    assert planned.passage_ids(warm, passages) == encoded
    assert "_tokenizer" not in vars(warm)  # the ids came from disk


def test_another_corpus_or_tokenizer_file_misses(cache_root: Path, tmp_path: Path) -> None:
    passages = load_corpus()
    tokenizer = create_tokenizer(DEFAULT_TOKENIZER_DIR)
    key = planned.corpus_key(tokenizer, passages)
    assert key is not None
    planned.passage_ids(tokenizer, passages)
    assert planned.read_corpus_ids(key, len(passages)) is not None
    assert planned.corpus_key(tokenizer, [*passages[:-1], passages[-1] + "!"]) != key
    copy = tmp_path / "qwen3-copy"
    shutil.copytree(DEFAULT_TOKENIZER_DIR, copy)
    assert planned.corpus_key(create_tokenizer(copy), passages) == key  # keyed by content, not by path
    source = copy / "tokenizer.json.xz"
    same_tokenizer_other_bytes = lzma.decompress(source.read_bytes()) + b"\n"
    source.write_bytes(lzma.compress(same_tokenizer_other_bytes, preset=0))
    assert planned.corpus_key(create_tokenizer(copy), passages) != key


def test_a_damaged_or_foreign_file_is_ignored_and_rewritten(cache_root: Path) -> None:
    passages = load_corpus()
    tokenizer = create_tokenizer(DEFAULT_TOKENIZER_DIR)
    want = planned.passage_ids(tokenizer, passages)
    key = planned.corpus_key(tokenizer, passages)
    (path,) = (cache_root / "corpus-ids").glob("*.json")
    for damage in ('{"key": "other", "ids": []}', "not json", f'{{"key": "{key}", "ids": [[1]]}}'):
        path.write_text(damage)
        assert planned.read_corpus_ids(str(key), len(passages)) is None
        assert planned.passage_ids(tokenizer, passages) == want
        assert planned.read_corpus_ids(str(key), len(passages)) == want
