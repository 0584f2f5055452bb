"""Whether streams of a tokenizer take the byte-level fast path: `fast_path_status(tokenizer)` builds the tables
once per tokenizer (from the backend's optional `token_bytes_table()` hook), verifies them against the
tokenizer's own decode (verify.py) and caches the outcome: a ByteDecoding, or None plus the reason the fast path
was refused. The outcome is also kept on disk by tokenizer content (table_cache.py), so later processes skip the
table build and the verification: they rebuild the lookup tables from the stored bytes (the file's key and
digest prove they are the verified ones; no decode by the tokenizer is needed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from detok_worker.stream.decode import table_cache
from detok_worker.stream.decode.registry import cached
from detok_worker.stream.decode.tables import ByteDecoding, build_byte_decoding
from detok_worker.stream.decode.verify import verify_byte_decoding
from detok_worker.tokenizer.protocol import HasTokenBytes, Tokenizer
from detok_worker.tokenizer.token_bytes import TokenBytesTable

log = logging.getLogger(__name__)
_NO_TABLE = "the tokenizer offers no byte table (its decoder is not a byte concatenation)"


@dataclass(frozen=True, slots=True)
class FastPathStatus:
    decoding: ByteDecoding | None
    reason: str  # why the fast path is used or refused, for logs and tests


def _build_and_verify(tokenizer: Tokenizer) -> tuple[FastPathStatus, TokenBytesTable | None]:
    table = tokenizer.token_bytes_table() if isinstance(tokenizer, HasTokenBytes) else None
    if table is None:
        return FastPathStatus(None, _NO_TABLE), None
    decoding = _decoding_of(tokenizer, table)
    mismatch = verify_byte_decoding(tokenizer, decoding)
    if mismatch is not None:
        log.info("byte-level fast path refused for tokenizer %r: %s", getattr(tokenizer, "name", "?"), mismatch)
        return FastPathStatus(None, f"the byte table does not reproduce decode: {mismatch}"), table
    scheme = "byte-fallback" if decoding.byte_fallback else "byte-level"
    return FastPathStatus(decoding, f"{scheme} table verified against decode"), table


def _decoding_of(tokenizer: Tokenizer, table: TokenBytesTable) -> ByteDecoding:
    return build_byte_decoding(table, tokenizer.vocab_size, frozenset(tokenizer.special_token_ids))


def _from_cache(tokenizer: Tokenizer, key: str) -> FastPathStatus | None:
    entry = table_cache.read_cached(key)
    if entry is None:
        return None
    if not entry.verified:
        return FastPathStatus(None, entry.reason)
    # The entry's key and digest (table_cache.py) prove these are the tables verified for this tokenizer.
    return FastPathStatus(_decoding_of(tokenizer, entry.table()), entry.reason)


def _build_status(tokenizer: Tokenizer) -> FastPathStatus:
    key = table_cache.cache_key(tokenizer)
    if key is None:
        return _build_and_verify(tokenizer)[0]
    status = _from_cache(tokenizer, key)
    if status is not None:
        return status
    with table_cache.build_lock(key):  # another process may have built it while this one waited
        status = _from_cache(tokenizer, key)
        if status is None:
            status, table = _build_and_verify(tokenizer)
            if status.reason != _NO_TABLE:
                table_cache.write_cached(key, table, status.decoding is not None, status.reason)
    return status


def fast_path_status(tokenizer: Tokenizer) -> FastPathStatus:
    """Whether (and with which tables) streams of this tokenizer use the fast path; built once per tokenizer."""
    return cached(tokenizer, "fast_path_status", lambda: _build_status(tokenizer))


def byte_decoding_for(tokenizer: Tokenizer) -> ByteDecoding | None:
    """The verified ByteDecoding of this tokenizer, or None when streams must use the generic algorithm.

    Workers may call this at start-up so the one-time build and verification (well under 2 s for a 200k
    vocabulary) does not land on the first request.
    """
    return fast_path_status(tokenizer).decoding
