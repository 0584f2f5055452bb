"""Prometheus export of the encode cache: the samples equal stats(), caches of one tokenizer are summed into one
series, and wrapping through the config exports to the process's default registry."""

from __future__ import annotations

from helpers.fixtures import load_fixture_tokenizer
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from detok_worker.config import TokenizerCacheConfig
from detok_worker.tokenizer.encode_cache import CachedTokenizer, wrap_with_encode_cache
from detok_worker.tokenizer.encode_cache.cache import export_encode_cache_metrics

SYSTEM = "<|im_start|>system\nYou are helpful.<|im_end|>\n"
PROMPTS = [SYSTEM + f"<|im_start|>user\nquestion {n}<|im_end|>\n<|im_start|>assistant\n" for n in range(5)]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_samples_are_the_cache_stats() -> None:
    registry = CollectorRegistry()
    cached = CachedTokenizer(load_fixture_tokenizer("qwen3"), l0_max_entries=3, l1_max_memory=1 << 20)
    export_encode_cache_metrics(cached, registry)
    for prompt in PROMPTS + PROMPTS + ["a", "b", "c", "d", "a"]:
        cached.encode(prompt)
    stats = cached.stats()
    for level, level_stats in (("l0", stats.l0), ("l1", stats.l1)):
        labels = {"tokenizer": "qwen3", "level": level}
        assert sample(registry, "detok_encode_cache_hits_total", **labels) == level_stats.hits
        assert sample(registry, "detok_encode_cache_misses_total", **labels) == level_stats.misses
        assert sample(registry, "detok_encode_cache_evictions_total", **labels) == level_stats.evictions
        assert sample(registry, "detok_encode_cache_entries", **labels) == level_stats.entries
        assert sample(registry, "detok_encode_cache_hit_rate", **labels) == level_stats.hit_rate
    assert stats.l0.evictions > 0 and stats.l1.hits > 0
    assert sample(registry, "detok_encode_cache_memory_bytes", tokenizer="qwen3") == stats.l1.memory_bytes
    assert sample(registry, "detok_encode_cache_max_memory_bytes", tokenizer="qwen3") == 1 << 20
    assert sample(registry, "detok_encode_cache_hit_tokens_total", tokenizer="qwen3") == stats.l1.hit_tokens
    for flag in ("False", "True"):
        assert sample(registry, "detok_encode_cache_l1_enabled", tokenizer="qwen3", add_special_tokens=flag) == 1.0


def test_two_caches_of_one_tokenizer_are_one_series() -> None:
    registry = CollectorRegistry()
    tokenizer = load_fixture_tokenizer("qwen3")
    caches = [CachedTokenizer(tokenizer, l0_max_entries=10) for _ in range(2)]
    for cache in caches:
        export_encode_cache_metrics(cache, registry)
        cache.encode("hello")
        cache.encode("hello")
    assert sample(registry, "detok_encode_cache_hits_total", tokenizer="qwen3", level="l0") == 2
    assert sample(registry, "detok_encode_cache_misses_total", tokenizer="qwen3", level="l0") == 2
    text = generate_latest(registry).decode()
    assert text.count('detok_encode_cache_hits_total{level="l0",tokenizer="qwen3"}') == 1
    assert "detok_encode_cache_memory_bytes{" not in text  # no L1 configured: no L1 samples


def test_wrapping_from_the_config_exports_to_the_default_registry() -> None:
    cached = wrap_with_encode_cache(load_fixture_tokenizer("mistral-sp-v1"), TokenizerCacheConfig(enable_l0=True))
    assert isinstance(cached, CachedTokenizer)
    cached.encode("[INST] hi [/INST]")
    cached.encode("[INST] hi [/INST]")
    hits = REGISTRY.get_sample_value("detok_encode_cache_hits_total", {"tokenizer": "mistral-sp-v1", "level": "l0"})
    assert hits is not None and hits >= 1


def test_a_new_registry_never_inherits_a_collected_registrys_collector() -> None:
    """Registries come and go (tests, per-scrape registries); each new one must get its own collector even when
    Python hands it the id() of one that was garbage collected."""
    import gc

    tokenizer = load_fixture_tokenizer("qwen3")
    gc.freeze()  # collect only what the loop makes (a full collection in a big test session takes ~1 s)
    try:
        for _ in range(50):
            registry = CollectorRegistry()
            cache = CachedTokenizer(tokenizer, l0_max_entries=10)
            export_encode_cache_metrics(cache, registry)
            cache.encode("hello")
            assert sample(registry, "detok_encode_cache_misses_total", tokenizer="qwen3", level="l0") == 1
            del registry, cache
            gc.collect()
    finally:
        gc.unfreeze()
