"""What loading a Hugging Face tokenizer.json costs besides building it, kept on disk per file content: the
decompressed JSON of a tokenizer.json.xz (lzma) and the vocabulary facts HFTokenizer derives from the whole
vocabulary (`get_vocab`) and from its added tokens: each a large part of a load. Every detok process
loads the tokenizer; with this only the first start after a new file pays for them, and with the facts at hand
HFTokenizer defers building the library tokenizer (`Tokenizer.from_str`, the slowest part) to its first use: a
worker whose fast-path tables come from their disk cache, or an engine stub that only needs the EOS and special
ids, never builds it.

Where: the detok cache directory (`cache_root()`: $DETOK_CACHE_DIR if set, empty disables every disk cache; else
$XDG_CACHE_HOME/detok or ~/.cache/detok), folder `tokenizer-load/`. Keyed by the sha256 of the file's bytes as
read (compressed or not) and the `tokenizers` version; written atomically (temporary file renamed over the
target). A file that is missing, unreadable or not what its key says is ignored and written again; any file may
be deleted at any time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import __version__ as tokenizers_version

from detok_worker.tokenizer.protocol import Fingerprinted, Tokenizer

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "DETOK_CACHE_DIR"
FORMAT_VERSION = 3
_SUBDIR = "tokenizer-load"
_FACTS_SUFFIX = ".vocab.json"


def cache_root() -> Path | None:
    """The detok disk cache directory (every cache has a folder in it), or None when caching is disabled."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit is not None:
        return Path(explicit).expanduser() if explicit.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "detok"


@dataclass(frozen=True, slots=True)
class VocabFacts:
    """What HFTokenizer needs from the whole vocabulary: its size (highest id + 1), the ids in it naming no
    token, the added tokens (id, content, special), ascending by id, and the word-start marker of its pieces (a
    Metaspace pre-tokenizer's replacement character; None without one)."""

    vocab_size: int
    unknown_ids: frozenset[int]
    added_tokens: tuple[tuple[int, str, bool], ...]
    word_start_marker: str | None = None


def content_key(tokenizer: Tokenizer, **parts: object) -> str | None:
    """The key of something the other disk caches compute from a tokenizer: a sha256 over its content fingerprint
    (the optional backend hook `content_fingerprint()`; None without one, which is then never cached), its class,
    vocabulary size and special ids, and `parts` (format, code version, ...; JSON-serialisable)."""
    fingerprint = tokenizer.content_fingerprint() if isinstance(tokenizer, Fingerprinted) else None
    if not fingerprint:
        return None
    kind = type(tokenizer)
    described = {
        **parts,
        "tokenizer": fingerprint,
        "class": f"{kind.__module__}.{kind.__qualname__}",
        "vocab_size": tokenizer.vocab_size,
        "special_ids": sorted(tokenizer.special_token_ids),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def load_key(source_sha256: str) -> str:
    return hashlib.sha256(f"{FORMAT_VERSION} tokenizers {tokenizers_version} {source_sha256}".encode()).hexdigest()


def _directory() -> Path | None:
    root = cache_root()
    return root / _SUBDIR if root is not None else None


def cached_json_path(key: str) -> Path | None:
    """The decompressed tokenizer.json stored under `key`, if there is one."""
    directory = _directory()
    path = directory / f"{key}.json" if directory is not None else None
    return path if path is not None and path.is_file() else None


def read_vocab_facts(key: str) -> VocabFacts | None:
    data = read_json_entry(_SUBDIR, key, _FACTS_SUFFIX)
    if data is None:
        return None
    try:
        added = tuple((int(i), str(content), bool(special)) for i, content, special in data["added_tokens"])
        marker = data["word_start_marker"]
        return VocabFacts(
            int(data["vocab_size"]),
            frozenset(int(i) for i in data["unknown_ids"]),
            added,
            str(marker) if marker is not None else None,
        )
    except (ValueError, KeyError, TypeError):
        return None


def write_entry(key: str, facts: VocabFacts, decompressed: str | None) -> None:
    """Store the facts (and the decompressed JSON, for a compressed source); a cache that cannot be written is
    skipped with a debug log: loading works without it."""
    directory = _directory()
    if directory is None or (decompressed is not None and not _write_file(directory, f"{key}.json", decompressed)):
        return
    payload = {
        "vocab_size": facts.vocab_size,
        "unknown_ids": sorted(facts.unknown_ids),
        "added_tokens": [list(token) for token in facts.added_tokens],
        "word_start_marker": facts.word_start_marker,
    }
    write_json_entry(_SUBDIR, key, payload, _FACTS_SUFFIX)


def read_json_entry(folder: str, key: str, suffix: str = ".json") -> dict[str, Any] | None:
    """The JSON object a disk cache stored in its `folder` of the cache directory under `key` (file key + suffix),
    or None: caching disabled, no such file, not a JSON object, or written for another key (each names its key)."""
    root = cache_root()
    if root is None:
        return None
    try:
        data = json.loads((root / folder / f"{key}{suffix}").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def write_json_entry(folder: str, key: str, payload: dict[str, Any], suffix: str = ".json") -> None:
    """Store `payload` (with its key) where read_json_entry finds it, atomically; a cache that cannot be written is
    skipped with a debug log: every cache's user works without it."""
    root = cache_root()
    if root is not None:
        _write_file(root / folder, f"{key}{suffix}", json.dumps({**payload, "key": key}, separators=(",", ":")))


def _write_file(directory: Path, name: str, text: str) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomically(directory / name, text)
    except OSError as exc:
        log.debug("disk cache not written in %s: %s", directory, exc)
        return False
    return True


def write_atomically(target: Path, text: str) -> None:
    fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
