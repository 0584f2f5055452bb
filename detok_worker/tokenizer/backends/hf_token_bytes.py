"""Per-token byte tables for Hugging Face `tokenizers` decoders whose decode is a byte concatenation.

Recognised decoders (anything else returns None and the streaming core uses its generic algorithm):
- `ByteLevel` (GPT-2 style byte-to-unicode mapping: Qwen, Llama-3, DeepSeek, gpt-oss): a token's bytes are its
  characters mapped back through the table; a token holding a character outside the table is taken verbatim as
  UTF-8 (what the Rust decoder does, e.g. for added tokens such as DeepSeek's `<｜end▁of▁sentence｜>`).
- `Sequence[Replace(str -> str), ByteFallback, Fuse, Strip(" ", n, 0)?]` (SentencePiece byte fallback: Llama-2,
  Mistral v1, Gemma): `<0xNN>` tokens are byte tokens, every other token is its text after the Replace.
Added tokens go through the decoder like any other token (checked for tokenizers 0.23; the stream verifies it).
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Tokenizer as RustTokenizer

from detok_worker.tokenizer.base import byte_to_unicode
from detok_worker.tokenizer.token_bytes import TokenBytesTable

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Characters of a ByteLevel token that the mapping does not cover are swapped for this one, which cannot be
# encoded as latin-1, so the whole token falls back to its verbatim UTF-8.
_UNMAPPED = "\U0010ffff"


def _byte_level_translation() -> dict[int, str]:
    """str.translate table: ByteLevel character -> chr(byte); other characters below 256 -> _UNMAPPED."""
    alphabet = byte_to_unicode()
    table = {b: ch for b, ch in alphabet.items() if ord(ch) == b}
    for b, ch in alphabet.items():
        if ord(ch) != b:  # a byte the alphabet moves to U+0100 onwards: its own code point is not a ByteLevel char
            table[b] = _UNMAPPED
            table[ord(ch)] = chr(b)
    return table


_BYTE_LEVEL_TRANSLATION = _byte_level_translation()


def _byte_level_piece(token: str) -> bytes:
    try:
        return token.translate(_BYTE_LEVEL_TRANSLATION).encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")


def _token_strings(tokenizer: RustTokenizer, size: int) -> list[str | None]:
    """What decode starts from for each id: the added token's content, else the model's token."""
    strings: list[str | None] = [None] * size
    for token, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
        strings[token_id] = token
    for token_id, added in tokenizer.get_added_tokens_decoder().items():
        strings[token_id] = added.content
    return strings


def _byte_fallback_options(steps: list[dict[str, Any]]) -> tuple[str, str, int] | None:
    """(replace pattern, replacement, strip count) if `steps` is a decoder sequence we model, else None."""
    kinds = [step.get("type") for step in steps]
    if kinds not in (["Replace", "ByteFallback", "Fuse"], ["Replace", "ByteFallback", "Fuse", "Strip"]):
        return None
    replace = steps[0]
    pattern = replace.get("pattern", {})
    if set(pattern) != {"String"} or not isinstance(replace.get("content"), str) or not pattern["String"]:
        return None
    strip = 0
    if kinds[-1] == "Strip":
        if steps[-1].get("content") != " " or steps[-1].get("stop") != 0:
            return None
        strip = int(steps[-1].get("start", 0))
    return pattern["String"], replace["content"], strip


def hf_token_bytes_table(tokenizer: RustTokenizer, size: int) -> TokenBytesTable | None:
    """The byte table of a Hugging Face tokenizer of `size` ids, or None if its decoder is not modelled."""
    if tokenizer.decoder is None:
        return None
    spec = json.loads(tokenizer.decoder.__getstate__())
    strings = _token_strings(tokenizer, size)
    if spec.get("type") == "ByteLevel":
        return TokenBytesTable(pieces=[None if s is None else _byte_level_piece(s) for s in strings])
    if spec.get("type") != "Sequence":
        return None
    options = _byte_fallback_options(spec.get("decoders", []))
    if options is None:
        return None
    old, new, strip = options
    pieces: list[bytes | None] = []
    byte_tokens: dict[int, int] = {}
    for token_id, token in enumerate(strings):
        if token is None:
            pieces.append(None)
            continue
        text = token.replace(old, new)
        match = _BYTE_TOKEN.fullmatch(text)
        if match:
            byte_tokens[token_id] = int(match.group(1), 16)
            pieces.append(bytes([byte_tokens[token_id]]))
        else:
            pieces.append(text.encode("utf-8"))
    return TokenBytesTable(pieces=pieces, byte_tokens=byte_tokens, strip_leading_spaces=strip)
