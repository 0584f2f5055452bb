"""An independent byte-accounting model of a tokenizer's decode, for the streaming tests.

Built from per-token bytes taken from the tokenizer's own files or reference library (not from detok_worker's
tables): ByteLevel tokens map back to bytes through the GPT-2 byte/unicode table; SentencePiece byte-fallback tokens
are `<0xNN>` bytes, other tokens are text with "▁" -> " ". Every output character is attributed to the id its first
byte came from, which gives the expected streamed text after a prompt (characters whose first byte is generated).

What is final is decided by definition, not by UTF-8 rules: the longest prefix of the text that no continuation
changes, trying every continuation that matters (one byte of each UTF-8 byte class, two or three continuation bytes,
or a text token that ends a byte run). Only the trailing bytes can be affected (a UTF-8 sequence is at most 4 bytes;
a Hugging Face byte run is all-or-nothing), so the search runs on the trailing bytes (or run) and is memoized.
"""

from __future__ import annotations

import codecs
import itertools
import json
import re
from dataclasses import dataclass
from functools import cache, lru_cache

LOSSY, RUN, PER_BYTE = "lossy", "run", "per_byte"
# Strip rules: Hugging Face Strip(" ", 1, 0) drops a space that starts the whole text; SentencePiece drops the
# leading space of the first piece only when that piece is text (a <0x20> byte token keeps it).
STRIP_NONE, STRIP_WHOLE_TEXT, STRIP_FIRST_PIECE = "none", "whole_text", "first_piece"

# One byte of each UTF-8 class (ASCII, continuation sub-ranges, C0/C1, leads with restricted second bytes, F5..FF).
_CLASS_BYTES = [0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEE, 0xF0, 0xF1, 0xF4]
_CLASS_BYTES.append(0xF5)
_CONTINUATION_BYTES = [0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF]
BYTE_CONTINUATIONS: list[bytes] = [bytes([b]) for b in _CLASS_BYTES] + [
    bytes(seq) for n in (2, 3) for seq in itertools.product(_CONTINUATION_BYTES, repeat=n)
]

_ERRORS: list[tuple[int, int]] = []


def _record_errors(error: UnicodeDecodeError) -> tuple[str, int]:
    _ERRORS.append((error.start, error.end))
    return "\ufffd", error.end


codecs.register_error("stream_oracle_record", _record_errors)


def decode_with_starts(data: bytes, per_byte: bool = False) -> list[tuple[str, int]]:
    """UTF-8 decode with replacement, as (character, index of its first byte) pairs: one U+FFFD per maximal
    ill-formed subpart (Rust's from_utf8_lossy), or per byte of it (per_byte, SentencePiece)."""
    _ERRORS.clear()
    text = data.decode("utf-8", "stream_oracle_record")
    errors = iter(list(_ERRORS))
    next_error = next(errors, None)
    out: list[tuple[str, int]] = []
    position = 0
    for ch in text:
        if next_error is not None and next_error[0] == position and ch == "\ufffd":
            starts = range(next_error[0], next_error[1]) if per_byte else (position,)
            out.extend((ch, start) for start in starts)
            position = next_error[1]
            next_error = next(errors, None)
        else:
            out.append((ch, position))
            position += len(ch.encode("utf-8"))
    assert position == len(data)
    return out


def incomplete_tail_length(data: bytes) -> int:
    """Length of the trailing bytes whose text some byte continuation still changes (0 if none), by search."""
    return _changeable(bytes(data[-3:]), False)[1]


def _decode(data: bytes, per_byte: bool) -> str:
    return "".join(ch for ch, _ in decode_with_starts(data, per_byte)) if per_byte else data.decode("utf-8", "replace")


@cache
def _changeable(key: bytes, per_byte: bool) -> tuple[int, int]:
    """(characters, bytes) at the end of key whose text some continuation changes."""
    base = _decode(key, per_byte)
    shortest = min(_common_prefix(base, _decode(key + c, per_byte)) for c in BYTE_CONTINUATIONS)
    if shortest == len(base):
        return 0, 0
    return len(base) - shortest, len(key) - decode_with_starts(key, per_byte)[shortest][1]


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _complete(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _gpt2_byte_of_char() -> dict[str, int]:
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {chr(b): b for b in keep}
    extra = 0
    for b in range(256):
        if b not in keep:
            mapping[chr(256 + extra)] = b
            extra += 1
    return mapping


_BYTE_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")


@dataclass
class Unit:
    """One token's contribution: bytes (byte-level), a byte (byte-fallback byte token) or text."""

    data: bytes
    is_byte: bool
    from_generated: bool


class ByteOracle:
    """The model: per-id bytes (and whether the id is a raw byte token), the special ids, the byte semantics."""

    semantics = LOSSY
    strip = STRIP_NONE

    def __init__(self, tokenizer) -> None:
        """From a Hugging Face tokenizer's token strings and decoder type."""
        rust = tokenizer.hf_tokenizer
        decoder = json.loads(rust.decoder.__getstate__())
        byte_fallback = decoder["type"] == "Sequence"
        byte_of = _gpt2_byte_of_char()
        data: list[bytes] = []
        is_byte: list[bool] = []
        unknown: set[int] = set()
        for token_id in range(tokenizer.vocab_size):
            token = rust.id_to_token(token_id)
            if token is None:  # an id inside the range that names no token (cl100k's 100256): no bytes
                unknown.add(token_id)
                data.append(b"")
                is_byte.append(False)
                continue
            match = _BYTE_TOKEN.fullmatch(token) if byte_fallback else None
            is_byte.append(match is not None)
            if match:
                data.append(bytes([int(match.group(1), 16)]))
            elif byte_fallback:
                data.append(token.replace("\u2581", " ").encode())
            elif all(ch in byte_of for ch in token):
                data.append(bytes(byte_of[ch] for ch in token))
            else:
                data.append(token.encode())
        self._setup(data, is_byte, tokenizer.special_token_ids, RUN if byte_fallback else LOSSY)
        self.unknown_ids = frozenset(unknown)  # ids inside the range that name no token (cl100k's 100256)
        if byte_fallback:
            self.strip = STRIP_WHOLE_TEXT

    @classmethod
    def from_pieces(
        cls,
        pieces: list[bytes],
        special: frozenset[int],
        *,
        byte_ids: frozenset[int] = frozenset(),
        semantics: str = LOSSY,
        strip: str = STRIP_NONE,
    ) -> ByteOracle:
        """From per-id bytes taken from any independent source; `byte_ids` are raw-byte tokens (run semantics)."""
        model = object.__new__(cls)
        model._setup(list(pieces), [i in byte_ids for i in range(len(pieces))], special, semantics)
        model.strip = strip
        return model

    def _setup(self, data: list[bytes], is_byte: list[bool], special: frozenset[int], semantics: str) -> None:
        self.semantics = semantics
        self.unknown_ids: frozenset[int] = frozenset()
        self.byte_fallback = semantics != LOSSY
        self.special = frozenset(special)
        self.vocab_size = len(data)
        self._data = data
        self._is_byte = is_byte
        self.byte_token_ids = [i for i, flag in enumerate(is_byte) if flag]
        self.id_of_byte = {data[i][0]: i for i in self.byte_token_ids}
        # Ids whose bytes are not complete UTF-8 on their own (byte tokens included).
        self.partial_ids = [i for i, d in enumerate(data) if not _complete(d)]

    def units(self, prompt: list[int], generated: list[int], skip: bool) -> list[Unit]:
        out = []
        for from_generated, ids in ((False, prompt), (True, generated)):
            for token_id in ids:
                if skip and token_id in self.special:
                    continue
                out.append(Unit(self._data[token_id], self._is_byte[token_id], from_generated))
        return out

    def chars(self, units: list[Unit]) -> list[tuple[str, bool]]:
        """Decoded characters with 'first byte is generated' flags."""
        if self.semantics == LOSSY:
            data = b"".join(u.data for u in units)
            origin = [u.from_generated for u in units for _ in u.data]
            return [(ch, origin[start]) for ch, start in decode_with_starts(data)]
        out: list[tuple[str, bool]] = []
        run: list[Unit] = []

        def resolve() -> None:
            data = b"".join(u.data for u in run)
            if self.semantics == RUN and not _complete(data):
                out.extend(("\ufffd", u.from_generated) for u in run)
            else:
                out.extend((ch, run[start].from_generated) for ch, start in decode_with_starts(data, per_byte=True))
            run.clear()

        for unit in units:
            if unit.is_byte:
                run.append(unit)
                continue
            resolve()
            out.extend((ch, unit.from_generated) for ch in unit.data.decode())
        resolve()
        whole_text = self.strip == STRIP_WHOLE_TEXT and out[:1] and out[0][0] == " "
        first_piece = self.strip == STRIP_FIRST_PIECE and units and not units[0].is_byte and units[0].data[:1] == b" "
        return out[1:] if whole_text or first_piece else out

    def changeable_chars(self, units: list[Unit]) -> int:
        """How many trailing characters of chars(units) some continuation still changes (the withheld part)."""
        if self.semantics == LOSSY:
            return _changeable(b"".join(u.data for u in units)[-3:], False)[0]
        run_start = len(units)
        while run_start > 0 and units[run_start - 1].is_byte:
            run_start -= 1
        if run_start == len(units):
            return 0
        run = b"".join(u.data for u in units[run_start:])
        if self.semantics == PER_BYTE:
            return _changeable(run[-3:], True)[0]
        return _changeable_run_chars(run, at_start=run_start == 0 and self.strip == STRIP_WHOLE_TEXT)

    def pending_units(self, units: list[Unit]) -> int:
        """How many trailing units can still change their text (0 if none)."""
        if self.semantics == LOSSY:
            return 0
        count = 0
        while count < len(units) and units[len(units) - 1 - count].is_byte:
            count += 1
        return count if self.changeable_chars(units) else 0

    def decode(self, ids: list[int], skip: bool) -> str:
        return "".join(ch for ch, _ in self.chars(self.units([], ids, skip)))

    def expected(self, prompt: list[int], generated: list[int], skip: bool) -> str:
        """The streamed text after `prompt`: characters whose first byte comes from `generated`."""
        return "".join(ch for ch, gen in self.chars(self.units(prompt, generated, skip)) if gen)

    def expected_final_so_far(self, prompt: list[int], generated: list[int], skip: bool) -> str:
        """What must have been emitted after the last id: expected() minus the part that can still change."""
        units = self.units(prompt, generated, skip)
        chars = self.chars(units)
        changeable = self.changeable_chars(units)
        if changeable:
            chars = chars[: len(chars) - changeable]
        return "".join(ch for ch, gen in chars if gen)


@lru_cache(maxsize=4096)
def _changeable_run_chars(run: bytes, at_start: bool) -> int:
    """Hugging Face ByteFallback: characters of a trailing byte run that some continuation changes."""

    def text(data: bytes) -> str:
        out = data.decode("utf-8") if _complete(data) else "\ufffd" * len(data)
        return out[1:] if at_start and out[:1] == " " else out

    base = text(run)
    shortest = min(_common_prefix(base, text(run + c)) for c in BYTE_CONTINUATIONS)
    return len(base) - shortest
