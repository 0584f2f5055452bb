"""The token ids of the corpus source's passages, on disk per tokenizer content and corpus text, so an engine stub
whose tokenizer defers building the library tokenizer (detok_worker/tokenizer/backends/hf.py) never builds it for
the corpus: with the ids here and the EOS and special ids from the tokenizer load cache, the stub starts without
`Tokenizer.from_str` (~0.45 s for Qwen3) and plans every request by a lookup.

Where: the detok cache directory (`cache_root()`, as for the other disk caches), folder `corpus-ids/`, one JSON
file per key (`content_key`: the tokenizer's content fingerprint, a tokenizer without one is never cached, and
a sha256 of every passage). A missing or unreadable file, or one written for another key, is ignored and
written again; any file may be deleted at any time.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from detok_worker.tokenizer.loading.load_cache import cache_root, content_key, write_atomically
from detok_worker.tokenizer.protocol import Tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_SUBDIR = "corpus-ids"


def corpus_key(tokenizer: Tokenizer, passages: list[str]) -> str | None:
    """The key of these passages' ids under this tokenizer, or None when the tokenizer gives no content
    fingerprint."""
    corpus = hashlib.sha256("\x00".join(passages).encode("utf-8", "surrogatepass")).hexdigest()
    return content_key(tokenizer, format=FORMAT_VERSION, passages=len(passages), corpus=corpus)


def _path(key: str) -> Path | None:
    root = cache_root()
    return root / _SUBDIR / f"{key}.json" if root is not None else None


def read_corpus_ids(key: str, count: int) -> list[list[int]] | None:
    """The ids of `count` passages stored under `key`, or None."""
    path = _path(key)
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ids = data["ids"]
        if data["key"] != key or len(ids) != count:
            return None
        return [[int(i) for i in passage] for passage in ids]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_corpus_ids(key: str, ids: list[list[int]]) -> None:
    """Store the ids (atomically); a cache that cannot be written is skipped: the stub works without it."""
    path = _path(key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"key": key, "ids": ids}, separators=(",", ":")))
    except OSError as exc:
        log.debug("corpus ids cache not written in %s: %s", path.parent, exc)


def passage_ids(tokenizer: Tokenizer, passages: list[str]) -> list[list[int]] | None:
    """The ids of every passage (no special tokens added), from the cache or encoded now and stored; None for a
    tokenizer without a content fingerprint (the source then encodes each passage at its first use)."""
    key = corpus_key(tokenizer, passages)
    if key is None:
        return None
    ids = read_corpus_ids(key, len(passages))
    if ids is None:
        ids = [encoding.ids for encoding in tokenizer.encode_batch(passages)]
        write_corpus_ids(key, ids)
    return ids
