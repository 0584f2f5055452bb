"""The per-token byte table a backend may offer so the streaming core can use its byte-level fast path.

A backend that can describe its decode as "concatenate per-token byte strings, then UTF-8 with replacement"
implements an optional method `token_bytes_table() -> TokenBytesTable | None`. The streaming core never trusts the
table: it verifies it against the backend's own `decode` before using it (`build_byte_decoding`).

Two decoding schemes are described by one table:
- byte-level (ByteLevel BPE, tiktoken): decode(ids) = b"".join(pieces).decode("utf-8", "replace").
- byte-fallback (SentencePiece family: Llama-2, Mistral v1, Gemma): tokens listed in `byte_tokens` are single raw
  bytes (`<0xNN>`); a maximal run of them is decoded as a whole (valid UTF-8 -> its text, otherwise one U+FFFD per
  byte); every other token's piece is UTF-8 text; then up to `strip_leading_spaces` spaces are removed from the
  start of the whole decoded text.
In both schemes a special token is dropped entirely (before any joining) when skip_special_tokens is set, unless
`skipped_special_ends_text` is set (byte-level scheme only; mistral-common's IGNORE policy): then the bytes before
a dropped special token are decoded on their own, so an unfinished character there becomes U+FFFD, exactly as if
the special token had been kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TokenBytesTable:
    """pieces[id] = the token's bytes as decode joins them (None for an id the tokenizer does not know)."""

    pieces: Sequence[bytes | None]
    # id -> byte value, for the byte-fallback scheme; empty for the byte-level scheme.
    byte_tokens: Mapping[int, int] = field(default_factory=dict)
    strip_leading_spaces: int = 0
    # skip_special_tokens drops a special token's text but it still ends the text before it (see the docstring).
    skipped_special_ends_text: bool = False

    @property
    def byte_fallback(self) -> bool:
        return bool(self.byte_tokens)
