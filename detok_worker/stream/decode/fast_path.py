"""Whether streams of a tokenizer take the byte-level fast path: `fast_path_status(tokenizer)` builds the tables
once per tokenizer (from the backend's optional `token_bytes_table()` hook), verifies them against the
tokenizer's own decode (verify.py) and caches the outcome: a ByteDecoding, or None plus the reason the fast path
was refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from detok_worker.stream.decode.registry import cached
from detok_worker.stream.decode.tables import ByteDecoding, build_byte_decoding
from detok_worker.stream.decode.verify import verify_byte_decoding
from detok_worker.tokenizer.protocol import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FastPathStatus:
    decoding: ByteDecoding | None
    reason: str  # why the fast path is used or refused, for logs and tests


def _build_status(tokenizer: Tokenizer) -> FastPathStatus:
    hook = getattr(tokenizer, "token_bytes_table", None)
    table = hook() if callable(hook) else None
    if table is None:
        return FastPathStatus(None, "the tokenizer offers no byte table (its decoder is not a byte concatenation)")
    decoding = build_byte_decoding(table, tokenizer.vocab_size, frozenset(tokenizer.special_token_ids))
    mismatch = verify_byte_decoding(tokenizer, decoding)
    if mismatch is not None:
        log.info("byte-level fast path refused for tokenizer %r: %s", getattr(tokenizer, "name", "?"), mismatch)
        return FastPathStatus(None, f"the byte table does not reproduce decode: {mismatch}")
    scheme = "byte-fallback" if decoding.byte_fallback else "byte-level"
    return FastPathStatus(decoding, f"{scheme} table verified against decode")


def fast_path_status(tokenizer: Tokenizer) -> FastPathStatus:
    """Whether (and with which tables) streams of this tokenizer use the fast path; built once per tokenizer."""
    return cached(tokenizer, "fast_path_status", lambda: _build_status(tokenizer))


def byte_decoding_for(tokenizer: Tokenizer) -> ByteDecoding | None:
    """The verified ByteDecoding of this tokenizer, or None when streams must use the generic algorithm.

    Workers may call this at start-up so the one-time build and verification (well under 2 s for a 200k
    vocabulary) does not land on the first request.
    """
    return fast_path_status(tokenizer).decoding
