"""The front's encode cache: L0 whole-prompt entries and L1 shared prefixes (`PrefixStore`) split where the
tokenizer's merges cannot cross (`plan_prefix_split`), exported to Prometheus (`export_encode_cache_metrics`)."""

from __future__ import annotations

from detok_worker.config import TokenizerCacheConfig
from detok_worker.tokenizer.encode_cache.cache import (
    CachedTokenizer,
    EncodeCacheStats,
    export_encode_cache_metrics,
    split_plan_for,
)
from detok_worker.tokenizer.protocol import Tokenizer

__all__ = ["CachedTokenizer", "EncodeCacheStats", "split_plan_for", "wrap_with_encode_cache"]


def wrap_with_encode_cache(tokenizer: Tokenizer, config: TokenizerCacheConfig) -> Tokenizer:
    """`tokenizer` behind the levels `config` enables, its stats exported to Prometheus (the process's default
    registry, see `export_encode_cache_metrics`); the tokenizer itself when both levels are off."""
    if not config.enable_l0 and not config.enable_l1:
        return tokenizer
    cached = CachedTokenizer(
        tokenizer,
        l0_max_entries=config.l0_max_entries if config.enable_l0 else None,
        l1_max_memory=config.l1_max_memory if config.enable_l1 else None,
    )
    export_encode_cache_metrics(cached)
    return cached
