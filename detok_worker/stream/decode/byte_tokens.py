"""The raw-byte tokens of a tokenizer that has no verified byte table (SentencePiece `<0xNN>` pieces), for the
generic algorithm: with them it knows which trailing ids are still an unfinished character (utf8.py) instead of
guessing from trailing U+FFFD.

Found through `token_to_id("<0xNN>")` and trusted only if decode agrees that they are bytes: every continuation
byte alone decodes to U+FFFD, byte ids spelling multi-byte characters decode to those characters, and an invalid
byte leaves the character after it alone (the run is decoded character by character, as SentencePiece does; with
Hugging Face's all-or-nothing ByteFallback runs the window could not start inside a run, and those tokenizers use
the fast path). The generic algorithm still asks decode itself what the text is; the byte values only tell it
which continuations to try.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from detok_worker.stream.decode.registry import cached
from detok_worker.stream.decode.utf8 import unfinished_length
from detok_worker.tokenizer.protocol import Tokenizer, TokenizerError

# Characters of every UTF-8 length above 1, and the edges of the restricted second-byte ranges.
_CHECK_TEXT = "é€😀\u0800\ud7ff\U00010000\U0010ffff"


@dataclass(frozen=True, slots=True)
class ByteTokens:
    value_of: dict[int, int]  # id -> the byte it stands for
    id_of: dict[int, int]  # byte -> its id

    def unfinished(self, ids: Sequence[int]) -> bytes:
        """The bytes of the trailing ids that are still an unfinished character (b"" if none)."""
        data = bytearray()
        for token_id in reversed(ids[-3:]):
            value = self.value_of.get(token_id)
            if value is None:
                break
            data.insert(0, value)
        size = unfinished_length(data)
        return bytes(data[len(data) - size :])

    def ids(self, data: bytes) -> list[int]:
        return [self.id_of[value] for value in data]


def _find_byte_tokens(tokenizer: Tokenizer) -> ByteTokens | None:
    token_to_id = getattr(tokenizer, "token_to_id", None)
    if not callable(token_to_id):
        return None
    special = tokenizer.special_token_ids
    id_of: dict[int, int] = {}
    for value in range(256):
        token_id = token_to_id(f"<0x{value:02X}>")
        if isinstance(token_id, int) and token_id not in special:
            id_of[value] = token_id
    if any(value not in id_of for value in range(0x80, 0x100)):  # every multi-byte character must be spellable
        return None
    tokens = ByteTokens({token_id: value for value, token_id in id_of.items()}, id_of)
    text = _CHECK_TEXT
    try:
        if any(tokenizer.decode([id_of[value]]) != "\ufffd" for value in range(0x80, 0xC0)):
            return None
        if tokenizer.decode(tokens.ids(text.encode())) != text:
            return None
        if tokenizer.decode(tokens.ids(b"\x80" + "é".encode())) != "\ufffdé":
            return None
    except TokenizerError:
        return None
    return tokens


def byte_tokens_for(tokenizer: Tokenizer) -> ByteTokens | None:
    """The tokenizer's verified raw-byte tokens, or None (found once per tokenizer)."""
    return cached(tokenizer, "generic_byte_tokens", lambda: _find_byte_tokens(tokenizer))
