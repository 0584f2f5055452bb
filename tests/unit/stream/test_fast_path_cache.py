"""The fast path's disk cache (detok_worker/stream/decode/table_cache.py): tables read back give exactly what
freshly built ones give; a corrupt file, a file of another tokenizer or a cache that cannot be written never
changes a result and never fails a load."""

from __future__ import annotations

import hashlib
import lzma
import random
import shutil
from pathlib import Path

import msgspec
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from helpers.tokenizer_files import MULTILINGUAL_TEXTS

from detok_worker.stream.decode import fast_path, table_cache
from detok_worker.stream.decode.byte_fallback import ByteFallbackDecodeStream
from detok_worker.stream.decode.byte_level import ByteLevelDecodeStream
from detok_worker.stream.decode.tables import ByteDecoding
from detok_worker.tokenizer import create_tokenizer

NAMES = sorted(FIXTURE_TOKENIZER_DIRS)
SMALL = "mistral-sp-v1"  # 32k ids: the quickest fixture to verify from scratch


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(table_cache.CACHE_DIR_ENV, str(tmp_path))
    return tmp_path / "fast-path"


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tokenizers fully verified during the test (a cache hit verifies nothing)."""
    seen: list[str] = []
    verify = fast_path.verify_byte_decoding

    def counting(tokenizer, decoding):  # type: ignore[no-untyped-def]
        seen.append(tokenizer.name)
        return verify(tokenizer, decoding)

    monkeypatch.setattr(fast_path, "verify_byte_decoding", counting)
    return seen


def _fresh(name: str):  # type: ignore[no-untyped-def]
    """A new tokenizer object (the in-process memo is per object, so its status comes from disk or a build)."""
    return create_tokenizer(FIXTURE_TOKENIZER_DIRS[name])


def _stream_outputs(tokenizer, decoding: ByteDecoding, ids: list[int], prompt: list[int], skip: bool) -> list[str]:  # type: ignore[no-untyped-def]
    kind = ByteFallbackDecodeStream if decoding.byte_fallback else ByteLevelDecodeStream
    stream = kind.open(tokenizer, decoding, prompt, skip)
    return [stream.step(i) or "" for i in ids] + [stream.flush() or ""]


def _request_ids(tokenizer, seed: int) -> list[int]:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    ids = [i for text in MULTILINGUAL_TEXTS for i in tokenizer.encode(text).ids]
    special = sorted(tokenizer.special_token_ids)
    noise = [rng.randrange(tokenizer.vocab_size) for _ in range(400)] + rng.sample(special, min(8, len(special)))
    noise = [i for i in noise if tokenizer.id_to_token(i) is not None]
    rng.shuffle(noise)
    return ids + noise


@pytest.mark.parametrize("name", NAMES)
def test_cached_tables_stream_exactly_as_freshly_built_ones(name: str, cache_dir: Path) -> None:
    tokenizer = load_fixture_tokenizer(name)
    built = fast_path.fast_path_status(tokenizer)  # the session's freshly built and verified tables
    assert built.decoding is not None
    key = table_cache.cache_key(tokenizer)
    assert key is not None
    written = table_cache.write_cached(key, tokenizer.token_bytes_table(), True, built.reason)
    assert written is not None and written.parent == cache_dir
    cached = fast_path._from_cache(tokenizer, key)
    assert cached is not None and cached.decoding is not None
    assert cached.decoding is not built.decoding
    assert cached.decoding == built.decoding  # every table, both skip settings
    ids = _request_ids(tokenizer, seed=len(name))
    for skip in (False, True):
        for prompt in ([], ids[:7]):
            generated = ids[len(prompt) :]
            fresh = _stream_outputs(tokenizer, built.decoding, generated, prompt, skip)
            assert _stream_outputs(tokenizer, cached.decoding, generated, prompt, skip) == fresh
        assert "".join(_stream_outputs(tokenizer, cached.decoding, ids, [], skip)) == tokenizer.decode(ids, skip)


def test_a_second_load_reads_the_cache_instead_of_verifying(cache_dir: Path, verifications: list[str]) -> None:
    first = fast_path.fast_path_status(_fresh(SMALL))
    assert verifications == [SMALL]
    assert [path.suffix for path in cache_dir.iterdir() if not path.name.startswith(".")] == [".msgpack"]
    second = fast_path.fast_path_status(_fresh(SMALL))
    assert verifications == [SMALL]  # no second verification
    assert second.decoding == first.decoding and second.reason == first.reason


def with_digest(payload: bytes) -> bytes:
    """A cache file holding `payload` with its own digest (so only decoding the entry can refuse it)."""
    return hashlib.sha256(payload).digest() + payload


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "wrong pieces type"])
def test_a_corrupt_cache_file_is_ignored_and_rebuilt(damage: str, cache_dir: Path, verifications: list[str]) -> None:
    expected = fast_path.fast_path_status(_fresh(SMALL)).decoding
    (path,) = cache_dir.glob("*.msgpack")
    data = path.read_bytes()
    broken = {
        "truncated": data[: len(data) // 2],
        "garbage": b"\x93not msgpack at all" * 50,
        "empty": b"",
        "wrong pieces type": with_digest(
            msgspec.msgpack.encode([table_cache.FORMAT_VERSION, path.stem, True, "ok", "x", {}, 0])
        ),
    }[damage]
    path.write_bytes(broken)
    status = fast_path.fast_path_status(_fresh(SMALL))
    assert status.decoding == expected
    assert verifications == [SMALL, SMALL]  # verified again from scratch
    entry = table_cache.read_cached(path.stem)
    assert entry is not None and entry.verified  # and the file was written again, whole


def test_a_cache_file_whose_tables_were_changed_after_writing_is_not_used(
    cache_dir: Path, verifications: list[str]
) -> None:
    tokenizer = _fresh(SMALL)
    expected = fast_path.fast_path_status(tokenizer).decoding
    assert expected is not None
    key = table_cache.cache_key(tokenizer)
    assert key is not None
    path = cache_dir / f"{key}.msgpack"
    written_digest = path.read_bytes()[:32]
    entry = table_cache.read_cached(key)
    assert entry is not None
    tampered = list(entry.pieces)
    changed = tokenizer.vocab_size // 3
    tampered[changed] = b"tampered"  # still a valid entry for this key: only the digest tells
    path.write_bytes(written_digest + msgspec.msgpack.encode(msgspec.structs.replace(entry, pieces=tampered)))
    assert table_cache.read_cached(key) is None
    status = fast_path.fast_path_status(_fresh(SMALL))
    assert status.decoding == expected
    assert status.decoding is not None and status.decoding.keep.pieces[changed] != b"tampered"
    assert verifications == [SMALL, SMALL]


def test_a_cache_built_for_another_tokenizer_is_never_used(cache_dir: Path, verifications: list[str]) -> None:
    qwen3, deepseek = _fresh("qwen3"), _fresh("deepseek-v3")
    qwen3_key, deepseek_key = table_cache.cache_key(qwen3), table_cache.cache_key(deepseek)
    assert qwen3_key is not None and deepseek_key is not None and qwen3_key != deepseek_key
    fast_path.fast_path_status(qwen3)
    # qwen3's file planted where deepseek's would be: its stored key gives it away.
    shutil.copy(cache_dir / f"{qwen3_key}.msgpack", cache_dir / f"{deepseek_key}.msgpack")
    status = fast_path.fast_path_status(deepseek)
    assert verifications == ["qwen3", "deepseek-v3"]
    assert status.decoding is not None and status.decoding.vocab_size == deepseek.vocab_size
    assert status.decoding == fast_path._build_and_verify(deepseek)[0].decoding
    entry = table_cache.read_cached(deepseek_key)
    assert entry is not None and len(entry.pieces) == deepseek.vocab_size


def test_the_key_follows_the_tokenizer_file_content(tmp_path: Path) -> None:
    document = lzma.decompress((FIXTURE_TOKENIZER_DIRS[SMALL] / "tokenizer.json.xz").read_bytes())
    keys = []
    for name, content in (("a", document), ("b", document), ("c", document + b"\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_bytes(content)
        keys.append(table_cache.cache_key(create_tokenizer(tmp_path / name)))
    assert keys[0] is not None and keys[0] == keys[1]  # the same content anywhere: one key
    assert keys[2] != keys[0]  # any change of the file: another key


def test_a_cache_dir_that_cannot_be_created_disables_caching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv(table_cache.CACHE_DIR_ENV, str(blocker))
    status = fast_path.fast_path_status(_fresh(SMALL))
    assert status.decoding is not None
    assert blocker.read_text() == "a file where the cache directory would be"


def test_a_read_only_cache_dir_disables_caching(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch, verifications: list[str]
) -> None:
    cache_dir.mkdir()
    cache_dir.chmod(0o555)

    def read_only(*args: object, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(13, "Read-only file system")  # what a non-root user gets (root ignores the mode)

    monkeypatch.setattr(table_cache.tempfile, "mkstemp", read_only)
    try:
        first = fast_path.fast_path_status(_fresh(SMALL))
        second = fast_path.fast_path_status(_fresh(SMALL))
    finally:
        cache_dir.chmod(0o755)
    assert first.decoding is not None and second.decoding == first.decoding
    assert verifications == [SMALL, SMALL]  # nothing cached: each load verifies
    assert not list(cache_dir.glob("*.msgpack"))


def test_an_empty_cache_setting_disables_caching(monkeypatch: pytest.MonkeyPatch, verifications: list[str]) -> None:
    monkeypatch.setenv(table_cache.CACHE_DIR_ENV, "")
    assert table_cache.cache_dir() is None
    assert fast_path.fast_path_status(_fresh(SMALL)).decoding is not None
    assert fast_path.fast_path_status(_fresh(SMALL)).decoding is not None
    assert verifications == [SMALL, SMALL]


def test_the_default_location_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(table_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert table_cache.cache_dir() == tmp_path / "detok" / "fast-path"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert table_cache.cache_dir() == tmp_path / "home" / ".cache" / "detok" / "fast-path"
