"""Which trailing bytes are still an unfinished character: the one UTF-8 fact every stream decides finality with.

The reference decoders (Rust's `String::from_utf8_lossy`, behind Hugging Face tokenizers and tiktoken; CPython's
`bytes.decode(errors="replace")`) replace each maximal subpart of an ill-formed sequence with one U+FFFD (Unicode
§3.9, "substitution of maximal subparts"). A continuation can change the text of data only where the data ends in
a proper prefix of a well-formed sequence (Unicode Table 3-7): the second byte of E0, ED, F0 and F4 is restricted,
so E0 80 (overlong), ED A0 (a surrogate's prefix), F0 80 (overlong) and F4 90 (beyond U+10FFFF) are already two
U+FFFD that nothing can change, and C0, C1, F5..FF never start a character. CPython's incremental decoder
(`final=False`) holds ED A0..ED BF back as if a continuation could complete them, so the streams do not use it.

Decoders that replace every byte of an ill-formed subpart (SentencePiece) or a whole run of byte tokens (Hugging
Face ByteFallback) agree on the same unfinished tail; they differ only in what the rest decodes to.
"""

from __future__ import annotations

# Allowed range of the second byte after these leading bytes (every other continuation byte is 80..BF).
_SECOND_BYTE: dict[int, tuple[int, int]] = {
    0xE0: (0xA0, 0xBF),
    0xED: (0x80, 0x9F),
    0xF0: (0x90, 0xBF),
    0xF4: (0x80, 0x8F),
}


def sequence_length(lead: int) -> int:
    """Length of the well-formed sequence this byte starts (0 for a continuation byte or one that starts none)."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 1 if lead < 0x80 else 0


def unfinished_length(data: bytes | bytearray) -> int:
    """How many trailing bytes of data are a proper prefix of a well-formed sequence (0..3): the only bytes whose
    text a continuation can still change. Nothing before them can change: a well-formed prefix starts with a
    leading byte, which never continues an earlier sequence."""
    end = len(data)
    for size in range(1, min(3, end) + 1):
        lead = data[end - size]
        if 0x80 <= lead <= 0xBF:
            continue
        if sequence_length(lead) <= size:
            return 0
        if size >= 2:
            low, high = _SECOND_BYTE.get(lead, (0x80, 0xBF))
            if not low <= data[end - size + 1] <= high:
                return 0
        return size
    return 0


def decode_finished(data: bytes) -> tuple[str, bytes]:
    """(the text of data without its unfinished tail, that tail): the text is final, the tail still pending."""
    size = unfinished_length(data)
    if not size:
        return data.decode("utf-8", "replace"), b""
    return data[:-size].decode("utf-8", "replace"), data[-size:]


def is_well_formed(data: bytes | bytearray) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def completion(unfinished: bytes) -> bytes:
    """Continuation bytes that turn an unfinished tail (see unfinished_length) into one well-formed character."""
    lead = unfinished[0]
    missing = sequence_length(lead) - len(unfinished)
    if len(unfinished) == 1:
        return bytes([_SECOND_BYTE.get(lead, (0x80, 0xBF))[0]]) + b"\x80" * (missing - 1)
    return b"\x80" * missing
