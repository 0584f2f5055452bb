"""Prometheus view of the encode caches of this process, read from `CachedTokenizer.stats()` at scrape time
(nothing is recorded on the encode path).

Families (labels: tokenizer, and level = l0 | l1 where given):
- detok_encode_cache_hits_total, _misses_total, _evictions_total {tokenizer,level}
- detok_encode_cache_hit_rate, detok_encode_cache_entries {tokenizer,level}
- detok_encode_cache_memory_bytes, detok_encode_cache_max_memory_bytes {tokenizer} (L1's byte count and bound)
- detok_encode_cache_hit_tokens_total {tokenizer}: prompt tokens served from cached L1 prefixes
- detok_encode_cache_l1_enabled {tokenizer,add_special_tokens}: 1 where L1 is on, 0 where the split check
  turned it off (the reason is in the log and in stats())
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from detok_worker.tokenizer.encode_cache.cache import CachedTokenizer, EncodeCacheStats
from detok_worker.tokenizer.encode_cache.cache import hit_rate as hits_per_lookup


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
        hit_rate = GaugeMetricFamily("detok_encode_cache_hit_rate", "Hits / lookups so far", labels=level_labels)
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
                hit_rate.add_metric(labels, hits_per_lookup(n_hits, n_misses))
                entries.add_metric(labels, sum(item.entries for item in level_stats))
            l1_stats = [stats.l1 for stats in group if stats.l1.max_memory_bytes]
            if l1_stats:
                memory.add_metric([name], sum(item.memory_bytes for item in l1_stats))
                max_memory.add_metric([name], sum(item.max_memory_bytes for item in l1_stats))
                hit_tokens.add_metric([name], sum(item.hit_tokens for item in l1_stats))
                for flag in ("False", "True"):
                    on = all(item.enabled and flag not in item.disabled_reasons for item in l1_stats)
                    l1_enabled.add_metric([name, flag], 1.0 if on else 0.0)
        yield from (hits, misses, evictions, hit_rate, entries, memory, max_memory, hit_tokens, l1_enabled)


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
