"""The token ids of the corpus source's passages, on disk per tokenizer content and corpus text, so an engine
whose tokenizer defers building the library tokenizer (detok_worker/tokenizer/backends/hf.py) never builds it for
the corpus: with the ids here and the EOS and special ids from the tokenizer load cache, the engine starts without
`Tokenizer.from_str` (BENCHMARKS.md, startup) and plans every request by a lookup.

Where: the detok cache directory (`cache_root()`, as for the other disk caches), folder `corpus-ids/`, one JSON
file per key (`content_key`: the tokenizer's content fingerprint, a tokenizer without one is never cached, and
a sha256 of every passage). A missing or unreadable file, or one written for another key, is ignored and
written again; any file may be deleted at any time.
"""

from __future__ import annotations

import hashlib

from detok_worker.tokenizer.loading.load_cache import content_key, read_json_entry, write_json_entry
from detok_worker.tokenizer.protocol import Tokenizer

FORMAT_VERSION = 1
_SUBDIR = "corpus-ids"


def corpus_key(tokenizer: Tokenizer, passages: list[str]) -> str | None:
    """The key of these passages' ids under this tokenizer, or None when the tokenizer gives no content
    fingerprint."""
    corpus = hashlib.sha256("\x00".join(passages).encode("utf-8", "surrogatepass")).hexdigest()
    return content_key(tokenizer, format=FORMAT_VERSION, passages=len(passages), corpus=corpus)


def read_corpus_ids(key: str, count: int) -> list[list[int]] | None:
    """The ids of `count` passages stored under `key`, or None."""
    data = read_json_entry(_SUBDIR, key)
    if data is None:
        return None
    try:
        ids = data["ids"]
        if len(ids) != count:
            return None
        return [[int(i) for i in passage] for passage in ids]
    except (ValueError, KeyError, TypeError):
        return None


def write_corpus_ids(key: str, ids: list[list[int]]) -> None:
    """Store the ids (atomically); a cache that cannot be written is skipped: the source works without it."""
    write_json_entry(_SUBDIR, key, {"ids": ids})


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
