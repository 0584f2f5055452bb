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
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

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

    def encode_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encode(text, add_special_tokens).ids  # through the cache levels

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


# Prometheus view of the encode caches of this process, read from `CachedTokenizer.stats()` at scrape time
# (nothing is recorded on the encode path).
#
# Families (labels: tokenizer, and level = l0 | l1 where given):
# - detok_encode_cache_hits_total, _misses_total, _evictions_total {tokenizer,level}
# - detok_encode_cache_hit_rate, detok_encode_cache_entries {tokenizer,level}
# - detok_encode_cache_memory_bytes, detok_encode_cache_max_memory_bytes {tokenizer} (L1's byte count and bound)
# - detok_encode_cache_hit_tokens_total {tokenizer}: prompt tokens served from cached L1 prefixes
# - detok_encode_cache_l1_enabled {tokenizer,add_special_tokens}: 1 where L1 is on, 0 where the split check
#   turned it off (the reason is in the log and in stats())


class EncodeCacheCollector:
    """Reports every live CachedTokenizer that was added to it (held weakly)."""

    def __init__(self) -> None:
        self._caches: weakref.WeakSet[CachedTokenizer] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, cache: CachedTokenizer) -> None:
        with self._lock:
            self._caches.add(cache)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            caches = list(self._caches)
        level_labels = ["tokenizer", "level"]
        hits = CounterMetricFamily("detok_encode_cache_hits", "Encode cache hits", labels=level_labels)
        misses = CounterMetricFamily("detok_encode_cache_misses", "Encode cache misses", labels=level_labels)
        evictions = CounterMetricFamily("detok_encode_cache_evictions", "Encode cache evictions", labels=level_labels)
        hit_rates = GaugeMetricFamily("detok_encode_cache_hit_rate", "Hits / lookups so far", labels=level_labels)
        entries = GaugeMetricFamily("detok_encode_cache_entries", "Cached entries", labels=level_labels)
        memory = GaugeMetricFamily(
            "detok_encode_cache_memory_bytes", "Bytes held by the L1 prefix cache", labels=["tokenizer"]
        )
        max_memory = GaugeMetricFamily(
            "detok_encode_cache_max_memory_bytes", "Bound of the L1 prefix cache", labels=["tokenizer"]
        )
        hit_tokens = CounterMetricFamily(
            "detok_encode_cache_hit_tokens", "Prompt tokens served from cached L1 prefixes", labels=["tokenizer"]
        )
        l1_enabled = GaugeMetricFamily(
            "detok_encode_cache_l1_enabled",
            "1 where the L1 prefix cache is on, 0 where the tokenizer's split check turned it off",
            labels=["tokenizer", "add_special_tokens"],
        )
        for name, group in _by_name(caches).items():
            for level in ("l0", "l1"):
                level_stats = [getattr(stats, level) for stats in group]
                if not any(item.enabled or item.hits + item.misses for item in level_stats):
                    continue
                labels = [name, level]
                n_hits, n_misses = sum(item.hits for item in level_stats), sum(item.misses for item in level_stats)
                hits.add_metric(labels, n_hits)
                misses.add_metric(labels, n_misses)
                evictions.add_metric(labels, sum(item.evictions for item in level_stats))
                hit_rates.add_metric(labels, hit_rate(n_hits, n_misses))
                entries.add_metric(labels, sum(item.entries for item in level_stats))
            l1_stats = [stats.l1 for stats in group if stats.l1.max_memory_bytes]
            if l1_stats:
                memory.add_metric([name], sum(item.memory_bytes for item in l1_stats))
                max_memory.add_metric([name], sum(item.max_memory_bytes for item in l1_stats))
                hit_tokens.add_metric([name], sum(item.hit_tokens for item in l1_stats))
                for flag in ("False", "True"):
                    on = all(item.enabled and flag not in item.disabled_reasons for item in l1_stats)
                    l1_enabled.add_metric([name, flag], 1.0 if on else 0.0)
        yield from (hits, misses, evictions, hit_rates, entries, memory, max_memory, hit_tokens, l1_enabled)


def _by_name(caches: list[CachedTokenizer]) -> dict[str, list[EncodeCacheStats]]:
    """Stats grouped by tokenizer name: two live caches of one tokenizer are summed, never reported twice."""
    groups: dict[str, list[EncodeCacheStats]] = {}
    for cache in caches:
        groups.setdefault(cache.name, []).append(cache.stats())
    return groups


# registry -> its collector; weak keys, because an id() of a collected registry can be reused by a new one
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, EncodeCacheCollector] = weakref.WeakKeyDictionary()
_collectors_lock = threading.Lock()


def export_encode_cache_metrics(cache: CachedTokenizer, registry: CollectorRegistry | None = None) -> None:
    """Report `cache` in `registry` (default: prometheus_client's global one) for as long as it lives."""
    target = registry if registry is not None else REGISTRY
    with _collectors_lock:
        collector = _collectors.get(target)
        if collector is None:
            collector = _collectors[target] = EncodeCacheCollector()
            target.register(collector)
    collector.add(cache)
