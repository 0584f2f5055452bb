"""Two-level encode cache for prompts: `CachedTokenizer` wraps any tokenizer and implements the same protocol.

- L0: exact match on (text, add_special_tokens); LRU bounded by entry count.
- L1: prefixes that end right after a special token (`prefix_cache`); the longest cached one is reused and only
  the rest is encoded. Used only for the add_special_tokens values `split_safety` proved exact for this tokenizer
  at construction; otherwise off, with the reason in the log and in `stats()`.

Results are always identical to the wrapped tokenizer's, ids and offsets. Every returned Encoding has lists of
its own, so a caller that modifies one cannot corrupt the cache. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from detok_worker.tokenizer.encode_cache.prefix import PrefixEncoder, PrefixHit, PrefixStore
from detok_worker.tokenizer.encode_cache.split_safety import (
    SplitPlan,
    plan_key,
    plan_prefix_split,
    read_plan,
    write_plan,
)
from detok_worker.tokenizer.protocol import Encoding, Tokenizer
from detok_worker.tokenizer.wrapper import TokenizerWrapper

logger = logging.getLogger(__name__)

_L0Entry = tuple[tuple[int, ...], tuple[tuple[int, int], ...]] | PrefixHit

_plans: weakref.WeakKeyDictionary[Any, SplitPlan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def split_plan_for(tokenizer: Tokenizer) -> SplitPlan:
    """The split plan of a tokenizer, computed once per tokenizer object (test encodes: slow) and
    kept on disk by tokenizer content (`read_plan`, `write_plan`)."""
    with _plans_lock:
        try:
            plan = _plans.get(tokenizer)
        except TypeError:  # not weak-referenceable: compute every time
            return _stored_or_planned(tokenizer)
        if plan is None:
            plan = _stored_or_planned(tokenizer)
            _plans[tokenizer] = plan
        return plan


def _stored_or_planned(tokenizer: Tokenizer) -> SplitPlan:
    key = plan_key(tokenizer)
    plan = read_plan(key) if key is not None else None
    if plan is None:
        plan = plan_prefix_split(tokenizer)
        if key is not None:
            write_plan(key, plan)
    return plan


def hit_rate(hits: int, misses: int) -> float:
    """Hits / lookups (0 before the first lookup)."""
    return hits / (hits + misses) if hits + misses else 0.0


@dataclass(frozen=True, slots=True)
class L0Stats:
    enabled: bool
    hits: int
    misses: int
    evictions: int
    entries: int
    max_entries: int

    @property
    def hit_rate(self) -> float:
        return hit_rate(self.hits, self.misses)


@dataclass(frozen=True, slots=True)
class L1Stats:
    enabled: bool
    # add_special_tokens value ("True"/"False") -> why L1 is off for it on this tokenizer
    disabled_reasons: dict[str, str]
    boundary_tokens: int
    dropped_tokens: int
    # hits + misses = encodes that reached L1; a text without any special token counts as a miss
    hits: int
    misses: int
    evictions: int
    entries: int
    memory_bytes: int
    max_memory_bytes: int
    # prompt tokens served from cached prefixes
    hit_tokens: int
    # encodes whose special tokens did not line up with the text (served uncached-exact, nothing inserted)
    unaligned: int

    @property
    def hit_rate(self) -> float:
        return hit_rate(self.hits, self.misses)


@dataclass(frozen=True, slots=True)
class EncodeCacheStats:
    l0: L0Stats
    l1: L1Stats

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON and metrics, hit rates included."""
        data = asdict(self)
        data["l0"]["hit_rate"] = self.l0.hit_rate
        data["l1"]["hit_rate"] = self.l1.hit_rate
        return data


class ExactMatchCache:
    """L0: thread-safe LRU from (text, add_special_tokens) to ids and offsets, bounded by entry count.

    An encoding L1 built on a cached prefix is stored as its parts (a PrefixHit) and turned into plain tuples at
    its first hit: storing a copy of every one-off prompt's few thousand token references would cost a garbage
    collector scan of all of them, a large part of an L1 hit; only prompts that come back pay it. Such an entry
    keeps its prefix chain alive after L1 evicts it, as a copy of its tokens would: L0 is bounded by entries.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries <= 0:
            raise ValueError(f"L0 max entries must be > 0, got {max_entries}")
        self.max_entries = max_entries
        # tuples, not lists: the garbage collector stops scanning them after one pass (lists it scans forever)
        self._entries: OrderedDict[tuple[str, bool], _L0Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, text: str, add_special_tokens: bool) -> Encoding | None:
        key = (text, add_special_tokens)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        if isinstance(entry, PrefixHit):
            ids, offsets = entry.build()
            with self._lock:
                if self._entries.get(key) is entry:
                    self._entries[key] = (tuple(ids), tuple(offsets))
            return Encoding(ids=ids, offsets=offsets)
        return Encoding(ids=list(entry[0]), offsets=list(entry[1]))

    def put(self, text: str, add_special_tokens: bool, encoding: Encoding, parts: PrefixHit | None = None) -> None:
        """Store `encoding` (or `parts`, the PrefixHit it was built from, which stands for it)."""
        key = (text, add_special_tokens)
        entry = parts if parts is not None else (tuple(encoding.ids), tuple(encoding.offsets))
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evictions += 1

    def stats(self) -> L0Stats:
        with self._lock:
            return L0Stats(True, self.hits, self.misses, self.evictions, len(self._entries), self.max_entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class CachedTokenizer(TokenizerWrapper):
    """A tokenizer with an L0 and/or L1 encode cache in front of `tokenizer.encode`; see the module docstring.

    l0_max_entries / l1_max_memory (bytes): None turns that level off. Everything but encode/encode_batch is
    the wrapped tokenizer's own (TokenizerWrapper); `inner` is the wrapped tokenizer.
    """

    def __init__(self, tokenizer: Tokenizer, *, l0_max_entries: int | None = None, l1_max_memory: int | None = None):
        super().__init__(tokenizer)
        self._l0 = ExactMatchCache(l0_max_entries) if l0_max_entries is not None else None
        self._l1: PrefixEncoder | None = None
        self._l1_store: PrefixStore | None = None
        self._plan: SplitPlan | None = None
        if l1_max_memory is not None:
            self._l1_store = PrefixStore(l1_max_memory)
            self._plan = split_plan_for(tokenizer)
            self._log_plan(self._plan)
            if self._plan.finder is not None and self._plan.framings:
                self._l1 = PrefixEncoder(tokenizer, self._plan.finder, self._plan.framings, self._l1_store)

    def _log_plan(self, plan: SplitPlan) -> None:
        for flag, reason in sorted(plan.disabled.items()):
            logger.warning("encode cache L1 is off for %s with add_special_tokens=%s: %s", self.name, flag, reason)
        if plan.dropped_tokens:
            examples = "; ".join(f"{token!r}: {why}" for token, why in list(plan.dropped_tokens.items())[:3])
            logger.info(
                "encode cache L1 for %s does not split at %d special token(s), e.g. %s",
                self.name,
                len(plan.dropped_tokens),
                examples,
            )
        if plan.finder is not None and plan.framings:
            logger.info(
                "encode cache L1 for %s splits at %d special token(s) for add_special_tokens in %s",
                self.name,
                len(plan.finder.token_ids),
                sorted(plan.framings),
            )

    # -- the cached part of the protocol --

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        if not isinstance(text, str):
            return self.inner.encode(text, add_special_tokens)  # the backend's own error for bad input
        add_special_tokens = bool(add_special_tokens)
        l0 = self._l0
        if l0 is not None:
            cached = l0.get(text, add_special_tokens)
            if cached is not None:
                return cached
        l1 = self._l1
        parts = None
        if l1 is not None and l1.handles(add_special_tokens):
            encoding, parts = l1.encode(text, add_special_tokens)
        else:
            encoding = self.inner.encode(text, add_special_tokens)
        if l0 is not None:
            l0.put(text, add_special_tokens, encoding, parts)
        return encoding

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]:
        if self._l0 is None and self._l1 is None:
            return self.inner.encode_batch(texts, add_special_tokens)
        return [self.encode(text, add_special_tokens) for text in texts]

    def stats(self) -> EncodeCacheStats:
        l0 = self._l0.stats() if self._l0 is not None else L0Stats(False, 0, 0, 0, 0, 0)
        plan = self._plan
        reasons = {str(flag): reason for flag, reason in sorted(plan.disabled.items())} if plan else {}
        if self._l1_store is None:
            l1 = L1Stats(False, reasons, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        else:
            counters = self._l1_store.counters()
            l1 = L1Stats(
                enabled=self._l1 is not None,
                disabled_reasons=reasons,
                boundary_tokens=len(plan.finder.token_ids) if plan and plan.finder else 0,
                dropped_tokens=len(plan.dropped_tokens) if plan else 0,
                **asdict(counters),
            )
        return EncodeCacheStats(l0=l0, l1=l1)

    def clear_cache(self) -> None:
        if self._l0 is not None:
            self._l0.clear()
        if self._l1_store is not None:
            self._l1_store.clear()

    def __getattr__(self, name: str) -> Any:
        # backend extras (set_chat_template, chat_template, byte-level tables, ...) stay reachable
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"CachedTokenizer({self.inner!r}, l0={self._l0 is not None}, l1={self._l1 is not None})"
