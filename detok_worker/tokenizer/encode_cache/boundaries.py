"""Where a prompt may be split for L1 of the encode cache: right after a special token (see prefix.py), and the
encodes around such a boundary."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from detok_worker.tokenizer.protocol import Encoding, Tokenizer

Offsets = list[tuple[int, int]]


# (start, end, token id) of a special token found in the text, in text order
Boundary = tuple[int, int, int]


# A text with more special tokens than this caches only its last ones (bounds work and entries per request).
MAX_BOUNDARIES_PER_TEXT = 512


class BoundaryFinder:
    """Finds special tokens in text the way the tokenizer's added-token matcher does: leftmost, then longest."""

    def __init__(self, token_ids: Mapping[str, int]) -> None:
        if not token_ids:
            raise ValueError("BoundaryFinder needs at least one token")
        self.token_ids = dict(token_ids)
        self._pattern = re.compile(_trie_pattern(self.token_ids))

    def find(self, text: str) -> list[Boundary]:
        token_ids = self.token_ids
        return [(match.start(), match.end(), token_ids[match.group()]) for match in self._pattern.finditer(text)]


def _trie_pattern(tokens: Iterable[str]) -> str:
    """A regex matching any of `tokens`, shaped as their trie: at a position it follows the one branch the next
    character allows and prefers going deeper over stopping, so it finds the longest token starting there."""
    trie: dict[str, Any] = {}
    for token in tokens:
        node = trie
        for char in token:
            node = node.setdefault(char, {})
        node[""] = {}  # a token ends here

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


@dataclass(frozen=True, slots=True)
class Framing:
    """What encode(text, add_special_tokens=True) adds around encode(text, add_special_tokens=False)."""

    lead_ids: tuple[int, ...] = ()
    lead_offsets: tuple[tuple[int, int], ...] = ()
    trail_ids: tuple[int, ...] = ()
    trail_offsets: tuple[tuple[int, int], ...] = ()

    def split(self, encoding: Encoding) -> bool:
        """True when `encoding` starts with the lead and ends with the trail (ids and offsets)."""
        ids, offsets = encoding.ids, encoding.offsets
        n_lead, n_trail = len(self.lead_ids), len(self.trail_ids)
        if len(ids) < n_lead + n_trail:
            return False
        if tuple(ids[:n_lead]) != self.lead_ids or tuple(ids[len(ids) - n_trail :]) != self.trail_ids:
            return False
        if not offsets:
            return True
        lead = tuple(tuple(span) for span in offsets[:n_lead])
        trail = tuple(tuple(span) for span in offsets[len(offsets) - n_trail :])
        return lead == self.lead_offsets and trail == self.trail_offsets


def locate_boundaries(
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    boundaries: Sequence[Boundary],
    begin: int,
    end: int,
    boundary_ids: frozenset[int],
) -> list[int] | None:
    """Index in ids[begin:end] of each boundary's special token, or None when the encoding does not line up.

    With offsets a token must sit exactly on the boundary's characters. Without offsets the special-token ids of
    the encoding must be exactly the boundaries' ids, in order (an extra one, e.g. an unknown-token id from the
    model, makes the alignment ambiguous).
    """
    positions: list[int] = []
    if not offsets:
        positions = [index for index in range(begin, end) if ids[index] in boundary_ids]
        if [ids[index] for index in positions] != [token_id for _, _, token_id in boundaries]:
            return None
        return positions
    position = begin
    for start, stop, token_id in boundaries:
        while True:
            try:
                index = ids.index(token_id, position, end)  # type: ignore[call-arg]
            except ValueError:
                return None
            span = offsets[index]
            position = index + 1
            if span[0] == start and span[1] == stop:
                break
        positions.append(index)
    return positions


def encode_after(tokenizer: Tokenizer, text: str, boundary: Boundary) -> tuple[list[int], Offsets] | None:
    """Ids and offsets (in `text` coordinates) of text[boundary end:], encoded behind the boundary's token.

    None when the tokenizer does not give the boundary token back as the first token, alone, on its own span.
    """
    return rest_after(tokenizer.encode(text[boundary[0] :], False), boundary)


def rest_after(encoding: Encoding, boundary: Boundary) -> tuple[list[int], Offsets] | None:
    """The part of encoding(text[boundary start:]) after the boundary token, offsets moved to `text` coordinates."""
    start, end, token_id = boundary
    ids, offsets = encoding.ids, encoding.offsets
    if not ids or ids[0] != token_id:
        return None
    if not offsets:
        return ids[1:], []
    first = offsets[0]
    if first[0] != 0 or first[1] != end - start:
        return None
    return ids[1:], [(a + start, b + start) for a, b in offsets[1:]]
