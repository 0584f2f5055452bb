"""L1 of the encode cache: token ids of prompt prefixes that end right after a special token.

Special tokens are matched atomically before any normalizer or pre-tokenizer runs, so the text between two of
them is tokenized on its own. For a boundary right after special token S:

    encode(prefix + rest) == encode(prefix) + encode(S + rest)[1:]

Encoding the rest behind a copy of S (and dropping S's id) keeps the rest where it is in the full text — not at
offset 0 — so "prepend on the first piece" rules (Metaspace prepend_scheme=first) see what they see in a full
encode. `split_safety` checks the identity per tokenizer by test encodes before this module is used.

Entries form chains: each cached boundary stores only the tokens between it and its parent (the previous cached
boundary of the same text), so caching every boundary of a long chat costs memory linear in its length. A node is
keyed by (its parent, the text between the parent's boundary and its own): a lookup walks the chain from the start
of the text, each character is hashed once (Python's string hash, cached on the segment), and a match compares
the text itself, so a hit is exact without a digest of every prefix. Every
use or insert refreshes a node's whole chain from the leaf up to the root, so a node is always more recently used
than any of its descendants and LRU eviction only ever removes leaves: a cached node's ancestors are cached too,
and the byte count covers everything the cache keeps alive.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from detok_worker.tokenizer.encode_cache.split_safety import (
    MAX_BOUNDARIES_PER_TEXT,
    Boundary,
    BoundaryFinder,
    Framing,
    Offsets,
    encode_after,
    locate_boundaries,
)
from detok_worker.tokenizer.protocol import Encoding, Tokenizer

# Estimated bytes a cached token keeps alive in CPython: list slot + int object, and for its offsets a list slot,
# a 2-tuple and two int objects. Deliberately the unshared worst case, so the real footprint stays below the count.
BYTES_PER_TOKEN_ID = 8 + 32
BYTES_PER_TOKEN_OFFSETS = 8 + 64 + 2 * 32
# Node object, its key tuple, two tuple headers and the ordered-dict slot (its segment string is counted apart).
BYTES_PER_NODE = 64 + 56 + 2 * 56 + 120

# A node's key: (parent node, or the add_special_tokens flag for a chain's first node; the text of its segment)
_Key = tuple["_Node | bool", str]


class _Node:
    __slots__ = ("key", "parent", "ids", "offsets", "n_bytes", "n_tokens")

    def __init__(self, key: _Key, parent: _Node | None, ids: list[int], offsets: Offsets) -> None:
        self.key = key
        self.parent = parent
        # tuples, not lists: the garbage collector stops scanning them after one pass (lists it scans forever)
        self.ids = tuple(ids)
        self.offsets = tuple(offsets)
        per_token = BYTES_PER_TOKEN_ID + (BYTES_PER_TOKEN_OFFSETS if offsets else 0)
        self.n_bytes = BYTES_PER_NODE + sys.getsizeof(key[1]) + per_token * len(ids)
        self.n_tokens = len(ids) + (parent.n_tokens if parent is not None else 0)

    def chain(self) -> list[_Node]:
        """This node and its ancestors, leaf first."""
        nodes: list[_Node] = []
        node: _Node | None = self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes


@dataclass(frozen=True, slots=True)
class PrefixStoreCounters:
    hits: int
    misses: int
    evictions: int
    entries: int
    memory_bytes: int
    max_memory_bytes: int
    hit_tokens: int
    unaligned: int


class PrefixStore:
    """Thread-safe, byte-bounded LRU of prefix chains, each node keyed by (parent, text of its segment)."""

    def __init__(self, max_memory_bytes: int) -> None:
        if max_memory_bytes <= 0:
            raise ValueError(f"L1 max memory must be > 0 bytes, got {max_memory_bytes}")
        self.max_memory_bytes = max_memory_bytes
        self._nodes: OrderedDict[_Key, _Node] = OrderedDict()
        self._lock = threading.Lock()
        self._memory_bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._hit_tokens = 0
        self._unaligned = 0

    def lookup(self, add_special_tokens: bool, segments: Sequence[str], min_index: int = 0) -> tuple[int, _Node] | None:
        """The deepest cached node along `segments` (the text cut after each boundary), with the index of its
        segment; counts a hit or a miss (a node before segment `min_index` is a miss too)."""
        with self._lock:
            nodes = self._nodes
            node: _Node | None = None
            index = -1
            parent: _Node | bool = add_special_tokens
            for segment in segments:
                child = nodes.get((parent, segment))
                if child is None:
                    break
                node = parent = child
                index += 1
            if node is None or index < min_index:
                self._misses += 1
                return None
            self._touch(node)
            self._hits += 1
            self._hit_tokens += node.n_tokens
            return index, node

    def insert(
        self,
        parent: _Node | None,
        add_special_tokens: bool,
        segments: Sequence[str],
        token_segments: Sequence[tuple[list[int], Offsets]],
    ) -> None:
        """Cache a chain of prefixes under `parent` (None = from the start of the text), then evict to the bound."""
        with self._lock:
            nodes = self._nodes
            if parent is not None and nodes.get(parent.key) is not parent:
                return  # evicted since it was looked up: its chain is gone
            leaf = parent
            for segment, (ids, offsets) in zip(segments, token_segments, strict=True):
                key: _Key = (leaf if leaf is not None else add_special_tokens, segment)
                existing = nodes.get(key)
                if existing is not None:
                    leaf = existing  # same parent, same text, same tokens: chains stay shared
                    continue
                leaf = _Node(key, leaf, ids, offsets)
                nodes[key] = leaf
                self._memory_bytes += leaf.n_bytes
            if leaf is not None:
                self._touch(leaf)
            while self._memory_bytes > self.max_memory_bytes and nodes:
                _, evicted = nodes.popitem(last=False)
                self._memory_bytes -= evicted.n_bytes
                self._evictions += 1

    def count_unaligned(self) -> None:
        with self._lock:
            self._unaligned += 1

    def count_miss(self) -> None:
        with self._lock:
            self._misses += 1

    def clear(self) -> None:
        with self._lock:
            self._nodes.clear()
            self._memory_bytes = 0

    def counters(self) -> PrefixStoreCounters:
        with self._lock:
            return PrefixStoreCounters(
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                entries=len(self._nodes),
                memory_bytes=self._memory_bytes,
                max_memory_bytes=self.max_memory_bytes,
                hit_tokens=self._hit_tokens,
                unaligned=self._unaligned,
            )

    def _touch(self, node: _Node) -> None:
        # leaf first, root last: the root ends up the most recently used
        nodes = self._nodes
        for member in node.chain():
            if nodes.get(member.key) is member:
                nodes.move_to_end(member.key)


def text_segments(text: str, boundaries: Sequence[Boundary]) -> list[str]:
    """The text up to the first boundary, then between each boundary and the next (the chain's node texts)."""
    segments: list[str] = []
    position = 0
    for _, end, _ in boundaries:
        segments.append(text[position:end])
        position = end
    return segments


def _segments(
    ids: list[int], offsets: Offsets, start: int, positions: Sequence[int]
) -> list[tuple[list[int], Offsets]]:
    """Split ids[start:] into the runs that end at each position (inclusive)."""
    segments = []
    for position in positions:
        segments.append((ids[start : position + 1], offsets[start : position + 1] if offsets else []))
        start = position + 1
    return segments


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """An encoding L1 built on a cached prefix, kept as its parts (the prefix chain and the rest after it).

    Cheap to keep: it holds a handful of references, where the built lists hold one per token (and a garbage
    collector pass has to look at every one of those once).
    """

    node: _Node
    rest_ids: tuple[int, ...]
    rest_offsets: tuple[tuple[int, int], ...]
    framing: Framing

    def build(self) -> tuple[list[int], Offsets]:
        """Fresh lists of the ids and offsets."""
        ids: list[int] = []
        offsets: Offsets = []
        for member in reversed(self.node.chain()):
            ids += member.ids
            offsets += member.offsets
        ids += self.rest_ids
        ids += self.framing.trail_ids
        if offsets or self.rest_offsets:
            offsets += self.rest_offsets
            offsets += self.framing.trail_offsets
        return ids, offsets


class PrefixEncoder:
    """Encodes through a PrefixStore for one tokenizer: longest cached boundary + the rest, or a full encode."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        finder: BoundaryFinder,
        framings: Mapping[bool, Framing],
        store: PrefixStore,
    ) -> None:
        self._tokenizer = tokenizer
        self._finder = finder
        self._boundary_ids = frozenset(finder.token_ids.values())
        self._framings = dict(framings)
        self.store = store

    def handles(self, add_special_tokens: bool) -> bool:
        return add_special_tokens in self._framings

    def encode(self, text: str, add_special_tokens: bool) -> tuple[Encoding, PrefixHit | None]:
        """The encoding, and its parts when it was built on a cached prefix (None: encoded in full)."""
        framing = self._framings[add_special_tokens]
        boundaries = self._finder.find(text)
        if not boundaries:
            self.store.count_miss()
            return self._tokenizer.encode(text, add_special_tokens), None
        if len(boundaries) > MAX_BOUNDARIES_PER_TEXT:
            boundaries = boundaries[-MAX_BOUNDARIES_PER_TEXT:]
        segments = text_segments(text, boundaries)
        # a prefix shorter than half the rest costs more to build on (the rest's offsets moved, the parts joined)
        # than its encode saves: such a text is encoded whole, its boundaries cached
        worth = next((i for i, (_, end, _) in enumerate(boundaries) if 3 * end >= len(text)), len(boundaries))
        found = self.store.lookup(add_special_tokens, segments, worth)
        if found is not None:
            hit = self._encode_from(text, boundaries, segments, found, add_special_tokens, framing)
            if hit is not None:
                ids, offsets = hit.build()
                return Encoding(ids=ids, offsets=offsets), hit
        return self._encode_full(text, boundaries, segments, add_special_tokens, framing), None

    def _encode_from(
        self,
        text: str,
        boundaries: list[Boundary],
        segments: list[str],
        found: tuple[int, _Node],
        add_special_tokens: bool,
        framing: Framing,
    ) -> PrefixHit | None:
        index, node = found
        boundary = boundaries[index]
        if boundary[1] == len(text):
            rest_ids: list[int] = []
            rest_offsets: Offsets = []
        else:
            rest = encode_after(self._tokenizer, text, boundary)
            if rest is None:
                self.store.count_unaligned()
                return None
            rest_ids, rest_offsets = rest
        later = boundaries[index + 1 :]
        if later:
            positions = locate_boundaries(rest_ids, rest_offsets, later, 0, len(rest_ids), self._boundary_ids)
            if positions is None:
                self.store.count_unaligned()
            else:
                later_tokens = _segments(rest_ids, rest_offsets, 0, positions)
                self.store.insert(node, add_special_tokens, segments[index + 1 :], later_tokens)
        return PrefixHit(node, tuple(rest_ids), tuple(rest_offsets), framing)

    def _encode_full(
        self,
        text: str,
        boundaries: list[Boundary],
        segments: list[str],
        add_special_tokens: bool,
        framing: Framing,
    ) -> Encoding:
        encoding = self._tokenizer.encode(text, add_special_tokens)
        if not framing.split(encoding):
            self.store.count_unaligned()
            return encoding
        ids, offsets = encoding.ids, encoding.offsets
        end = len(ids) - len(framing.trail_ids)
        positions = locate_boundaries(ids, offsets, boundaries, len(framing.lead_ids), end, self._boundary_ids)
        if positions is None:
            self.store.count_unaligned()
        else:
            self.store.insert(None, add_special_tokens, segments, _segments(ids, offsets, 0, positions))
        return encoding
