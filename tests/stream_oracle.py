"""An independent byte-accounting model of the fixture tokenizers' decode, for the streaming tests.

Built from the tokenizer's token strings only (not from detok_worker's byte tables): ByteLevel tokens map back to
bytes through the GPT-2 byte/unicode table; SentencePiece byte-fallback tokens are `<0xNN>` bytes, other tokens
are text with "▁" -> " ". Every output character is attributed to the id its first byte came from, which gives
the expected streamed text after a prompt (characters whose first byte is generated) and the part of the text
that may still change (an incomplete UTF-8 sequence at the end, or a trailing run of byte tokens).
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass

_ERRORS: list[tuple[int, int]] = []


def _record_errors(error: UnicodeDecodeError) -> tuple[str, int]:
    _ERRORS.append((error.start, error.end))
    return "\ufffd", error.end


codecs.register_error("stream_oracle_record", _record_errors)


def decode_with_starts(data: bytes) -> list[tuple[str, int]]:
    """UTF-8 decode with replacement, as (character, index of its first byte) pairs."""
    _ERRORS.clear()
    text = data.decode("utf-8", "stream_oracle_record")
    errors = iter(list(_ERRORS))
    next_error = next(errors, None)
    out: list[tuple[str, int]] = []
    position = 0
    for ch in text:
        if next_error is not None and next_error[0] == position and ch == "\ufffd":
            out.append((ch, position))
            position = next_error[1]
            next_error = next(errors, None)
        else:
            out.append((ch, position))
            position += len(ch.encode("utf-8"))
    assert position == len(data)
    return out


def incomplete_tail_length(data: bytes) -> int:
    """Length of the trailing bytes that are a valid but incomplete UTF-8 sequence (0 if none)."""
    for size in (1, 2, 3):
        if (
            len(data) >= size
            and _valid_prefix(data[-size:])
            and codecs.utf_8_decode(data[-size:], "strict", False)[1] == 0
        ):
            return size
    return 0


def _valid_prefix(data: bytes) -> bool:
    """True if data is valid UTF-8 except possibly for an incomplete sequence at its end."""
    try:
        codecs.utf_8_decode(data, "strict", False)
        return True
    except UnicodeDecodeError:
        return False


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
    def __init__(self, tokenizer) -> None:
        rust = tokenizer.hf_tokenizer
        decoder = json.loads(rust.decoder.__getstate__())
        self.byte_fallback = decoder["type"] == "Sequence"
        self.special = tokenizer.special_token_ids
        self.vocab_size = tokenizer.vocab_size
        byte_of = _gpt2_byte_of_char()
        self._data: list[bytes] = []
        self._is_byte: list[bool] = []
        self.byte_token_ids: list[int] = []
        self.id_of_byte: dict[int, int] = {}
        self.unknown_ids: set[int] = set()  # ids inside the range that name no token (cl100k's 100256)
        for token_id in range(tokenizer.vocab_size):
            token = rust.id_to_token(token_id)
            if token is None:
                self.unknown_ids.add(token_id)
                self._is_byte.append(False)
                self._data.append(b"")
            elif self.byte_fallback:
                match = _BYTE_TOKEN.fullmatch(token)
                self._is_byte.append(match is not None)
                if match:
                    self.byte_token_ids.append(token_id)
                    self.id_of_byte[int(match.group(1), 16)] = token_id
                    self._data.append(bytes([int(match.group(1), 16)]))
                else:
                    self._data.append(token.replace("\u2581", " ").encode())
            else:
                self._is_byte.append(False)
                if all(ch in byte_of for ch in token):
                    self._data.append(bytes(byte_of[ch] for ch in token))
                else:
                    self._data.append(token.encode())
        # Ids whose bytes are not complete UTF-8 on their own (byte tokens included).
        self.partial_ids = [i for i, d in enumerate(self._data) if not _complete(d)]

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
        if not self.byte_fallback:
            data = b"".join(u.data for u in units)
            origin = [u.from_generated for u in units for _ in u.data]
            return [(ch, origin[start]) for ch, start in decode_with_starts(data)]
        out: list[tuple[str, bool]] = []
        run: list[Unit] = []

        def resolve() -> None:
            data = b"".join(u.data for u in run)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                out.extend(("\ufffd", u.from_generated) for u in run)
            else:
                starts = [start for _, start in decode_with_starts(data)]
                out.extend((ch, run[start].from_generated) for ch, start in zip(text, starts, strict=True))
            run.clear()

        for unit in units:
            if unit.is_byte:
                run.append(unit)
                continue
            resolve()
            out.extend((ch, unit.from_generated) for ch in unit.data.decode())
        resolve()
        if out and out[0][0] == " ":  # Strip(" ", 1, 0) on the whole text
            out = out[1:]
        return out

    def pending_units(self, units: list[Unit]) -> int:
        """How many trailing units can still change their text (the withheld part)."""
        if self.byte_fallback:
            count = 0
            while count < len(units) and units[len(units) - 1 - count].is_byte:
                count += 1
            return count
        return 0

    def decode(self, ids: list[int], skip: bool) -> str:
        return "".join(ch for ch, _ in self.chars(self.units([], ids, skip)))

    def expected(self, prompt: list[int], generated: list[int], skip: bool) -> str:
        """The streamed text after `prompt`: characters whose first byte comes from `generated`."""
        return "".join(ch for ch, gen in self.chars(self.units(prompt, generated, skip)) if gen)

    def expected_final_so_far(self, prompt: list[int], generated: list[int], skip: bool) -> str:
        """What must have been emitted after the last id: expected() minus the part that can still change."""
        units = self.units(prompt, generated, skip)
        if self.byte_fallback:
            pending = self.pending_units(units)
            stable_units = units[: len(units) - pending]
            return "".join(ch for ch, gen in self.chars(stable_units) if gen)
        data = b"".join(u.data for u in units)
        tail = incomplete_tail_length(data)
        chars = self.chars(units)
        if tail:
            chars = chars[:-1]  # the incomplete sequence decodes to exactly one U+FFFD at the end
        return "".join(ch for ch, gen in chars if gen)
