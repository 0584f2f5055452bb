"""The tokenizer load cache (detok_worker/tokenizer/loading/load_cache.py): a load that reads the decompressed
JSON and the vocabulary facts back gives exactly the tokenizer a load from the source gives; a damaged file is
ignored and rewritten; an empty DETOK_CACHE_DIR writes nothing."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.tokenizer_files import MULTILINGUAL_TEXTS
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import models, pre_tokenizers

from detok_worker.tokenizer import DEFAULT_TOKENIZER_DIR, InvalidTokenIdError, TokenizerLoadError, create_tokenizer
from detok_worker.tokenizer.backends import hf
from detok_worker.tokenizer.loading import load_cache


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(load_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizer-load"


def fingerprint(tokenizer: object) -> tuple[object, ...]:
    encodings = tokenizer.encode_batch(MULTILINGUAL_TEXTS)  # type: ignore[attr-defined]
    ids = [encoding.ids for encoding in encodings]
    return (
        tokenizer.vocab_size,  # type: ignore[attr-defined]
        tokenizer._unknown_ids,  # type: ignore[attr-defined]
        sorted(tokenizer.special_token_ids),  # type: ignore[attr-defined]
        ids,
        [[tuple(span) for span in encoding.offsets] for encoding in encodings],
        [tokenizer.decode(sequence) for sequence in ids],  # type: ignore[attr-defined]
    )


def test_a_second_load_reads_the_cache_and_gives_the_same_tokenizer(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = create_tokenizer(DEFAULT_TOKENIZER_DIR)  # Qwen3, tokenizer.json.xz
    assert sorted(path.suffixes[-1] for path in cache_root.iterdir()) == [".json", ".json"]  # JSON + facts

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a cached load must neither decompress nor read the whole vocabulary")

    monkeypatch.setattr(hf.lzma, "decompress", refuse)
    monkeypatch.setattr(hf, "read_vocab_facts", refuse)
    second = create_tokenizer(DEFAULT_TOKENIZER_DIR)
    assert fingerprint(second) == fingerprint(first)
    assert second.content_fingerprint() == first.content_fingerprint()


def write_tokenizer_with_holes(directory: Path) -> Path:
    """A word-level tokenizer whose ids 1, 3 and 4 name no token, as tokenizer.json.xz."""
    tokenizer = RustTokenizer(models.WordLevel({"[UNK]": 0, "hello": 2, "world": 5}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir()
    (directory / "tokenizer.json.xz").write_bytes(lzma.compress(tokenizer.to_str().encode()))
    return directory


def test_ids_that_name_no_token_stay_invalid_after_a_cached_load(cache_root: Path, tmp_path: Path) -> None:
    directory = write_tokenizer_with_holes(tmp_path / "holes")
    loads = [create_tokenizer(directory) for _ in range(2)]  # the second from the cache
    for tokenizer in loads:
        assert tokenizer.vocab_size == 6
        assert tokenizer.encode("hello world").ids == [2, 5]
        with pytest.raises(InvalidTokenIdError):
            tokenizer.decode([2, 3])
    assert any(path.name.endswith(".vocab.json") for path in cache_root.iterdir())


def test_a_damaged_cache_file_is_ignored_and_rewritten(cache_root: Path) -> None:
    want = fingerprint(create_tokenizer(DEFAULT_TOKENIZER_DIR))
    (cached_json,) = [path for path in cache_root.iterdir() if not path.name.endswith(".vocab.json")]
    cached_json.write_text('{"not": "a tokenizer"')
    assert fingerprint(create_tokenizer(DEFAULT_TOKENIZER_DIR)) == want
    assert cached_json.stat().st_size > 1_000_000  # written again from the source


def test_an_empty_cache_dir_setting_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(load_cache.CACHE_DIR_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    directory = write_tokenizer_with_holes(tmp_path / "holes")
    assert create_tokenizer(directory).encode("world").ids == [5]
    assert load_cache.cache_root() is None
    assert not (tmp_path / "xdg").exists()


def test_a_cached_load_defers_the_library_build_and_answers_the_same_before_it(cache_root: Path) -> None:
    first = create_tokenizer(DEFAULT_TOKENIZER_DIR)
    second = create_tokenizer(DEFAULT_TOKENIZER_DIR)
    assert "_tokenizer" in vars(first) and "_tokenizer" not in vars(second)
    eos = second.special_tokens.eos
    assert eos is not None
    before_build = (second.vocab_size, second.special_tokens, second.special_token_ids, second.eos_token_ids)
    assert before_build == (first.vocab_size, first.special_tokens, first.special_token_ids, first.eos_token_ids)
    assert second.token_to_id(eos) == first.hf_tokenizer.token_to_id(eos)
    assert "_tokenizer" not in vars(second)
    assert fingerprint(second) == fingerprint(first)  # built at its first use
    assert "_tokenizer" in vars(second)


def test_a_source_changed_after_a_deferred_load_is_refused_and_a_new_load_reads_it(
    cache_root: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "plain"
    directory.mkdir()
    plain = lzma.decompress((DEFAULT_TOKENIZER_DIR / "tokenizer.json.xz").read_bytes())
    (directory / "tokenizer.json").write_bytes(plain)
    create_tokenizer(directory)
    deferred = create_tokenizer(directory)
    assert "_tokenizer" not in vars(deferred)
    holes = write_tokenizer_with_holes(tmp_path / "holes")
    (directory / "tokenizer.json").write_bytes(lzma.decompress((holes / "tokenizer.json.xz").read_bytes()))
    with pytest.raises(TokenizerLoadError, match="changed since it was loaded"):
        deferred.encode("hello world")
    reloaded = create_tokenizer(directory)  # another file content: another key, nothing cached for it yet
    assert reloaded.vocab_size == 6 and reloaded.encode("hello world").ids == [2, 5]


def test_a_cached_load_knows_the_word_start_marker_without_building(cache_root: Path) -> None:
    mistral_dir = FIXTURE_TOKENIZER_DIRS["mistral-sp-v1"]
    assert create_tokenizer(mistral_dir).word_start_marker() == "\u2581"  # type: ignore[attr-defined]
    second = create_tokenizer(mistral_dir)
    assert "_tokenizer" not in second.__dict__  # a deferred build: the marker comes from the cached facts
    assert second.word_start_marker() == "\u2581"  # type: ignore[attr-defined]
    assert "_tokenizer" not in second.__dict__
    assert create_tokenizer(DEFAULT_TOKENIZER_DIR).word_start_marker() is None  # type: ignore[attr-defined]
