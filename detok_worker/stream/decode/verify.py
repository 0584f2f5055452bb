"""Check a ByteDecoding against the tokenizer's own decode before any stream uses it ("never guess").

1. Every id alone, with skip_special_tokens off (and the special ids with it on): one decode_batch call each.
2. Random id sequences (fixed seed, so the outcome is deterministic), biased towards ids whose bytes are not
   complete UTF-8 on their own (byte tokens, partial characters) and special ids, both skip settings, decoded by
   the fast-path streams themselves and compared with decode.
3. Random pairs of partial ids, which is where concatenation and run rules differ from per-token decoding.
Any difference refuses the fast path (the caller logs the first one). Takes well under 2 s for 200k ids.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from detok_worker.stream.decode.byte_fallback import ByteFallbackDecodeStream
from detok_worker.stream.decode.byte_level import ByteLevelDecodeStream
from detok_worker.stream.decode.generic import batch_decoder
from detok_worker.stream.decode.tables import ByteDecoding
from detok_worker.tokenizer.protocol import Tokenizer, TokenizerError

SEED = 20240601
RANDOM_SEQUENCES = 600  # per skip setting
PARTIAL_PAIRS = 3000
REPLACEMENT = "\ufffd"


def _single_texts(decoding: ByteDecoding, ids: Sequence[int], skip_special_tokens: bool) -> list[str]:
    """What decode([id]) must be for each id, straight from the tables (one lookup per id; only the ids without
    a complete text of their own, a small minority, take the slower route)."""
    tables = decoding.tables(skip_special_tokens)
    texts, pieces = tables.texts, tables.pieces
    byte_values = tables.byte_values if decoding.byte_fallback else None
    out = [texts[token_id] for token_id in ids]
    for index, text in enumerate(out):
        if text is None:
            token_id = ids[index]
            piece = pieces[token_id]
            assert piece is not None
            if byte_values is not None and byte_values[token_id] >= 0:  # a run of one byte: UTF-8 only if ASCII
                out[index] = piece.decode("ascii") if piece[0] < 0x80 else REPLACEMENT
            else:
                out[index] = piece.decode("utf-8", "replace")
    strip = decoding.strip_leading_spaces
    if strip:
        return [text[min(strip, len(text) - len(text.lstrip(" "))) :] if text[:1] == " " else text for text in out]
    return out  # type: ignore[return-value]


def _stream_texts(
    tokenizer: Tokenizer, decoding: ByteDecoding, sequences: list[list[int]], skip_special_tokens: bool
) -> list[str]:
    stream_class = ByteFallbackDecodeStream if decoding.byte_fallback else ByteLevelDecodeStream
    out = []
    for ids in sequences:
        stream = stream_class.open(tokenizer, decoding, (), skip_special_tokens)
        out.append("".join(stream.step_batch(ids)) + (stream.flush() or ""))
    return out


def _first_difference(sequences: list[list[int]], got: list[str], expected: list[str], skip: bool) -> str | None:
    if got == expected:
        return None
    for ids, actual, wanted in zip(sequences, got, expected, strict=True):
        if actual != wanted:
            return f"ids {ids} (skip_special_tokens={skip}): decode gives {actual!r}, the table gives {wanted!r}"
    return None


def _random_sequences(
    decoding: ByteDecoding, known: list[int], special: list[int], rng: random.Random
) -> list[list[int]]:
    partial = [i for i in known if decoding.keep.texts[i] is None] or known
    sequences = []
    for _ in range(RANDOM_SEQUENCES):
        sequence = []
        for _ in range(rng.randint(2, 16)):
            roll = rng.random()
            pool = partial if roll < 0.45 else special if roll < 0.55 and special else known
            sequence.append(rng.choice(pool))
        sequences.append(sequence)
    sequences += [[rng.choice(partial), rng.choice(partial)] for _ in range(PARTIAL_PAIRS)]
    sequences += [[rng.choice(known), rng.choice(partial), rng.choice(special or known)] for _ in range(200)]
    return sequences


def verify_byte_decoding(tokenizer: Tokenizer, decoding: ByteDecoding) -> str | None:
    """None if the tables reproduce decode on every check, else a description of the first difference."""
    if decoding.vocab_size != tokenizer.vocab_size:
        return f"the table has {decoding.vocab_size} ids, the tokenizer {tokenizer.vocab_size}"
    special = sorted(i for i in tokenizer.special_token_ids if decoding.keep.pieces[i] is not None)
    unknown = decoding.unknown_ids
    known = [i for i in range(decoding.vocab_size) if i not in unknown] if unknown else list(range(decoding.vocab_size))
    rng = random.Random(SEED)
    try:
        for skip, ids in ((False, known), (True, special + rng.sample(known, min(2000, len(known))))):
            sequences = [[i] for i in ids]
            got = batch_decoder(tokenizer, skip)(sequences)
            mismatch = _first_difference(sequences, got, _single_texts(decoding, ids, skip), skip)
            if mismatch:
                return mismatch
        sequences = _random_sequences(decoding, known, special, rng)
        for skip in (False, True):
            got = batch_decoder(tokenizer, skip)(sequences)
            mismatch = _first_difference(sequences, got, _stream_texts(tokenizer, decoding, sequences, skip), skip)
            if mismatch:
                return mismatch
    except TokenizerError as error:  # e.g. an id the table knows but decode rejects
        return f"decode failed: {error}"
    return None
