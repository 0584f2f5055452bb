"""The immutable per-tokenizer tables the byte-level fast paths run on (built from a backend's TokenBytesTable).

fast_path.py builds them once per tokenizer and verifies them (verify.py). Per-request state lives in the stream
objects, never here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from detok_worker.tokenizer.protocol import check_token_ids
from detok_worker.tokenizer.token_bytes import TokenBytesTable

FeedMemo = dict[tuple[bytes, int], tuple[str, bytes]]  # (pending bytes, id) -> (text, pending bytes after)

# byte_values entries that are not a byte: an ordinary token, and a special token removed by skip_special_tokens.
NOT_A_BYTE = -1
SKIPPED = -2


@dataclass(frozen=True, slots=True)
class DecodeTables:
    """Lookup tables for one skip_special_tokens setting, indexed by token id.

    texts[id]: the token's text when decoding it needs no neighbour and it is not empty; None when its bytes are not
    complete UTF-8, when it is a byte-fallback byte token, a skipped special token, or an unknown id (the streams
    handle all of those off the one-lookup path). The hot path looks up only ints >= 0 (a negative index would wrap
    around to a real token) and treats IndexError as "not a token".
    pieces[id]: the token's bytes (b'' for a skipped special token), None for an unknown id.
    byte_values[id]: byte-fallback scheme only: the byte of a byte token, NOT_A_BYTE or SKIPPED.
    feed_memo: the byte-level streams' shared memo of their off-lookup steps, (pending bytes, id) -> (text, pending
    bytes after); both sides are a pure function of these tables, so every stream on them can share it.
    text_enders: skipped special ids that still end the text before them (TokenBytesTable.skipped_special_ends_text):
    after one, no pending bytes remain (an unfinished character before it is U+FFFD).
    """

    texts: list[str | None]
    pieces: list[bytes | None]
    byte_values: list[int] | None
    text_enders: frozenset[int] = frozenset()
    feed_memo: FeedMemo = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ByteDecoding:
    """A tokenizer's decode as a byte concatenation (see detok_worker/tokenizer/token_bytes.py for the schemes)."""

    vocab_size: int
    byte_fallback: bool
    strip_leading_spaces: int
    unknown_ids: frozenset[int]  # ids in [0, vocab_size) that name no token
    keep: DecodeTables  # skip_special_tokens=False
    skip: DecodeTables  # skip_special_tokens=True

    def tables(self, skip_special_tokens: bool) -> DecodeTables:
        return self.skip if skip_special_tokens else self.keep


def check_ids(decoding: ByteDecoding, ids: Sequence[int]) -> None:
    """Raise InvalidTokenIdError naming the first entry that is not a token id (checks the whole batch first)."""
    check_token_ids(ids, decoding.vocab_size, decoding.unknown_ids)


def _nonempty_text(piece: bytes | None) -> str | None:
    """The piece's text if it is non-empty, complete UTF-8; else None."""
    if not piece:
        return None
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return None


def build_byte_decoding(table: TokenBytesTable, vocab_size: int, special_ids: frozenset[int]) -> ByteDecoding:
    """Turn a backend's TokenBytesTable into lookup tables for both skip_special_tokens settings."""
    pieces = list(table.pieces[:vocab_size])
    pieces += [None] * (vocab_size - len(pieces))
    texts = [_nonempty_text(piece) for piece in pieces]
    byte_values: list[int] | None = None
    if table.byte_fallback:
        byte_values = [NOT_A_BYTE] * vocab_size
        for token_id, value in table.byte_tokens.items():
            if 0 <= token_id < vocab_size:
                byte_values[token_id] = value
                texts[token_id] = None
    skip_texts, skip_pieces = list(texts), list(pieces)
    skip_byte_values = None if byte_values is None else list(byte_values)
    text_enders: frozenset[int] = frozenset()
    if table.skipped_special_ends_text and not table.byte_fallback:
        text_enders = frozenset(i for i in special_ids if 0 <= i < len(table.pieces) and table.pieces[i] is not None)
    for token_id in special_ids:
        if 0 <= token_id < vocab_size and pieces[token_id] is not None:
            skip_texts[token_id] = None
            skip_pieces[token_id] = b""
            if skip_byte_values is not None:
                skip_byte_values[token_id] = SKIPPED
    return ByteDecoding(
        vocab_size=vocab_size,
        byte_fallback=table.byte_fallback,
        strip_leading_spaces=table.strip_leading_spaces,
        unknown_ids=frozenset(i for i, piece in enumerate(pieces) if piece is None),
        keep=DecodeTables(texts, pieces, byte_values),
        skip=DecodeTables(skip_texts, skip_pieces, skip_byte_values, text_enders),
    )
