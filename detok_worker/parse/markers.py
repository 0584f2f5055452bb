"""Finding markers (like `<think>` or `<tool_call>`) in streamed text, holding back what may be the start of one."""

from __future__ import annotations

from collections.abc import Sequence


def held_suffix_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def find_first(text: str, markers: Sequence[str], start: int = 0) -> tuple[int, str]:
    """The earliest occurrence of any marker in text[start:] (the longest marker on a tie): (index, marker), or
    (-1, "")."""
    found, which = -1, ""
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (found < 0 or at < found or (at == found and len(marker) > len(which))):
            found, which = at, marker
    return found, which


def split_before_marker(buffer: str, markers: Sequence[str]) -> tuple[str, str, str]:
    """(text before the first marker, the marker, the rest) when a marker is in `buffer`; otherwise
    (the text that is certainly not part of a marker, "", the held-back suffix)."""
    at, marker = find_first(buffer, markers)
    if at >= 0:
        return buffer[:at], marker, buffer[at + len(marker) :]
    hold = held_suffix_len(buffer, markers)
    return buffer[: len(buffer) - hold], "", buffer[len(buffer) - hold :]
