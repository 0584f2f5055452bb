"""CachedTokenizer: identical ids and offsets to the wrapped tokenizer with L0 only, L1 only and L0+L1, on the
miss path and the hit path, over chat prompts rendered through real templates and edge strings; plus BOS
handling, key separation between add_special_tokens values, stats, isolation of results and thread safety."""

from __future__ import annotations

import threading

import pytest
from helpers.encode_cache_corpus import boundary_tokens, chat_prompts, edge_strings
from helpers.fixtures import load_fixture_tokenizer

from detok_worker.config import TokenizerCacheConfig
from detok_worker.tokenizer.encode_cache import CachedTokenizer, wrap_with_encode_cache
from detok_worker.tokenizer.protocol import Encoding, Tokenizer

LEVELS = {
    "l0": {"l0_max_entries": 10_000},
    "l1": {"l1_max_memory": 50 * 1024 * 1024},
    "l0+l1": {"l0_max_entries": 10_000, "l1_max_memory": 50 * 1024 * 1024},
}


def as_lists(encoding: Encoding) -> tuple[list[int], list[tuple[int, int]]]:
    return list(encoding.ids), [tuple(span) for span in encoding.offsets]  # type: ignore[misc]


@pytest.fixture(scope="module")
def prompts_by_tokenizer() -> dict[str, list[str]]:
    return {}


def corpus(name: str, tokenizer: Tokenizer, cache: dict[str, list[str]]) -> list[str]:
    if name not in cache:
        cache[name] = chat_prompts(name, tokenizer) + edge_strings(tokenizer)
    return cache[name]


@pytest.mark.parametrize("add_special_tokens", [False, True])
@pytest.mark.parametrize("level", sorted(LEVELS))
def test_every_prompt_encodes_like_the_uncached_tokenizer(
    fixture_tokenizer_name: str,
    fixture_tokenizer: Tokenizer,
    level: str,
    add_special_tokens: bool,
    prompts_by_tokenizer,
) -> None:
    prompts = corpus(fixture_tokenizer_name, fixture_tokenizer, prompts_by_tokenizer)
    assert len(prompts) >= 30 + 20
    expected = [as_lists(encoding) for encoding in fixture_tokenizer.encode_batch(prompts, add_special_tokens)]
    cached = CachedTokenizer(fixture_tokenizer, **LEVELS[level])
    passes = ("first pass (misses, and L1 hits on earlier turns)", "second pass (hits)", "third pass (hits)")
    for attempt in passes:
        l0_hits_before = cached.stats().l0.hits
        for prompt, want in zip(prompts, expected, strict=True):
            assert as_lists(cached.encode(prompt, add_special_tokens)) == want, (attempt, prompt[:200])
    stats = cached.stats()
    if "l0" in level:
        assert stats.l0.hits - l0_hits_before == len(prompts)  # the whole third pass
    if "l1" in level:
        assert stats.l1.enabled and stats.l1.disabled_reasons == {}
        assert stats.l1.hits > len(prompts) // 4, stats.l1  # the hit path really ran, on many prompts
        assert stats.l1.unaligned == 0


def test_encode_batch_matches_encode(fixture_tokenizer_name: str, fixture_tokenizer: Tokenizer) -> None:
    prompts = chat_prompts(fixture_tokenizer_name, fixture_tokenizer, count=6)
    cached = CachedTokenizer(fixture_tokenizer, l0_max_entries=100, l1_max_memory=1 << 20)
    for flag in (False, True):
        batch = cached.encode_batch(prompts, flag)
        assert [as_lists(e) for e in batch] == [as_lists(e) for e in fixture_tokenizer.encode_batch(prompts, flag)]


def test_no_second_bos_after_a_prefix_hit() -> None:
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    bos_id = tokenizer.token_to_id("<s>")
    history = "[INST] Hi there [/INST] Hello!</s>"
    prompt = history + "[INST] And now? [/INST]"
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 20)
    cached.encode(history, True)  # caches the prefix ending at </s>, which starts with the BOS the tokenizer adds
    hits_before = cached.stats().l1.hits
    result = cached.encode(prompt, True)
    assert cached.stats().l1.hits == hits_before + 1
    assert result.ids[0] == bos_id and result.ids.count(bos_id) == 1
    assert as_lists(result) == as_lists(tokenizer.encode(prompt, True))


def test_add_special_tokens_values_never_share_an_entry() -> None:
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    text = "[INST] question [/INST] answer</s>[INST] next [/INST]"
    with_bos, without_bos = tokenizer.encode(text, True), tokenizer.encode(text, False)
    assert with_bos.ids != without_bos.ids  # the two values really differ on this tokenizer
    for order in ((True, False), (False, True)):
        cached = CachedTokenizer(tokenizer, l0_max_entries=100, l1_max_memory=1 << 20)
        first, second = order
        cached.encode(text, first)
        cached.encode(text + " more", first)  # L1 now holds prefixes of `text` for `first`
        stats = cached.stats()
        result = cached.encode(text, second)
        after = cached.stats()
        assert after.l0.hits == stats.l0.hits and after.l1.hits == stats.l1.hits  # nothing served across values
        assert as_lists(result) == as_lists(with_bos if second else without_bos)


def test_offsets_on_a_hit_point_into_the_full_text() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    system = "<|im_start|>system\n" + "Be helpful, 礼貌 and brief. " * 40 + "<|im_end|>\n"
    prompt = system + "<|im_start|>user\nWhat is 2+2? 🤔<|im_end|>\n<|im_start|>assistant\n"
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 20)
    cached.encode(system, False)
    result = cached.encode(prompt, False)
    assert cached.stats().l1.hits == 1
    assert as_lists(result) == as_lists(tokenizer.encode(prompt, False))
    question = prompt.index("What")
    spans_after_prefix = [span for span in result.offsets if span[0] >= len(system)]
    assert "".join(prompt[start:end] for start, end in spans_after_prefix if start >= question).startswith("What")


def test_returned_encodings_are_private_copies() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    want = as_lists(tokenizer.encode(prompt))
    cached = CachedTokenizer(tokenizer, l0_max_entries=10, l1_max_memory=1 << 20)
    for _ in range(3):
        result = cached.encode(prompt)
        assert as_lists(result) == want
        result.ids.append(-1)
        result.ids[0] = -2
        result.offsets.clear()


def test_l0_is_an_lru_bounded_by_entries_with_exact_counters() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    cached = CachedTokenizer(tokenizer, l0_max_entries=2)
    for text in ("a", "b", "a", "c", "b", "a"):
        cached.encode(text)
    # a miss, b miss, a hit, c miss (evicts b), b miss (evicts a), a miss (evicts c)
    stats = cached.stats().l0
    assert (stats.hits, stats.misses, stats.evictions, stats.entries) == (1, 5, 3, 2)
    assert stats.hit_rate == pytest.approx(1 / 6)
    assert cached.stats().as_dict()["l0"]["hit_rate"] == pytest.approx(1 / 6)


def test_l0_serves_the_second_visit_of_a_prompt_built_on_an_l1_prefix() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    system = "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    cached = CachedTokenizer(tokenizer, l0_max_entries=100, l1_max_memory=1 << 20)
    cached.encode(system + "<|im_start|>user\nfirst<|im_end|>\n")  # a full encode, caching the prefixes
    prompt = system + "<|im_start|>user\nsecond<|im_end|>\n"  # built on a cached prefix
    want = as_lists(tokenizer.encode(prompt))
    for visit in range(4):  # L1 hit, L0 hit (from the stored parts), L0 hits (from plain tuples)
        result = cached.encode(prompt)
        assert as_lists(result) == want, visit
        result.ids.clear()  # a caller's changes must not reach the cache
        result.offsets.append((0, 0))
    stats = cached.stats()
    assert stats.l1.hits == 1 and stats.l0.hits == 3


def test_l1_counts_hits_misses_and_served_tokens() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    prefix = "<|im_start|>system\nYou are helpful.<|im_end|>\n"
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 20)
    cached.encode("no special tokens at all")  # a miss: nothing to look up
    cached.encode(prefix + "<|im_start|>user\nA")  # a miss; caches 3 boundaries
    cached.encode(prefix + "<|im_start|>user\nB")  # a hit at the third boundary
    stats = cached.stats().l1
    assert (stats.hits, stats.misses, stats.entries) == (1, 2, 3)
    assert stats.hit_tokens == len(tokenizer.encode(prefix + "<|im_start|>").ids)
    assert 0 < stats.memory_bytes <= stats.max_memory_bytes


def test_a_segment_is_reused_only_under_the_same_parent() -> None:
    # L1 keys a node by (parent, text since the parent's boundary): the same turn after another system prompt, or
    # the same segments with one left out, must not be taken for a cached prefix
    tokenizer = load_fixture_tokenizer("qwen3")
    turn = "<|im_start|>user\nSame question<|im_end|>\n"
    first = "<|im_start|>system\nAlpha<|im_end|>\n" + turn
    other = "<|im_start|>system\nBeta 你好<|im_end|>\n" + turn
    skipped = "<|im_start|>\n" + turn  # first's nodes 1, 3 and 4 without node 2: same segments, other parents
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 20)
    cached.encode(first)
    for text in (other, skipped):
        assert as_lists(cached.encode(text)) == as_lists(tokenizer.encode(text))
    stats = cached.stats().l1
    # each shares only first's first node, "<|im_start|>" (one token): too short a prefix to build on, a miss
    assert (stats.hits, stats.misses, stats.hit_tokens) == (0, 3, 0)
    assert as_lists(cached.encode(first + "<|im_start|>assistant\n")) == as_lists(
        tokenizer.encode(first + "<|im_start|>assistant\n")
    )
    # the whole first chain: up to its last special token (the final newline is not a boundary)
    assert cached.stats().l1.hit_tokens == len(tokenizer.encode(first.removesuffix("\n")).ids)


def test_a_prefix_shorter_than_half_the_rest_is_not_built_on() -> None:
    # building on a cached prefix moves the rest's offsets and joins the parts: for a short prefix that costs more
    # than encoding it, so the text is encoded whole (a miss) and its boundaries cached for the next one
    tokenizer = load_fixture_tokenizer("qwen3")
    system = "<|im_start|>system\nYou answer briefly.<|im_end|>\n"
    long_turn = "<|im_start|>user\n" + "Tell me everything about tea. " * 10 + "<|im_end|>\n"
    short_turn = "<|im_start|>user\nTea?<|im_end|>\n"
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 20)
    cached.encode(system + short_turn)
    assert as_lists(cached.encode(system + long_turn)) == as_lists(tokenizer.encode(system + long_turn))
    stats = cached.stats().l1
    assert (stats.hits, stats.misses) == (0, 2)  # the system prompt is cached, but short against the long turn
    assert as_lists(cached.encode(system + long_turn + short_turn)) == as_lists(
        tokenizer.encode(system + long_turn + short_turn)
    )
    stats = cached.stats().l1
    # the long turn's boundaries were cached by the whole encode: built on up to its end
    assert (stats.hits, stats.hit_tokens) == (1, len(tokenizer.encode(system + long_turn.removesuffix("\n")).ids))


def test_concurrent_encodes_stay_exact_under_eviction() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    prompts = chat_prompts("qwen3", tokenizer, count=12)
    expected = {prompt: as_lists(tokenizer.encode(prompt)) for prompt in prompts}
    cached = CachedTokenizer(tokenizer, l0_max_entries=16, l1_max_memory=64 * 1024)  # small: constant eviction
    failures: list[str] = []

    def work(seed: int) -> None:
        order = prompts[seed::2] + prompts[::-1]
        for prompt in order * 2:
            if as_lists(cached.encode(prompt)) != expected[prompt]:
                failures.append(prompt)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    stats = cached.stats()
    assert stats.l1.evictions > 0 and stats.l0.evictions > 0
    assert stats.l1.memory_bytes <= stats.l1.max_memory_bytes


def test_bad_sizes_are_rejected() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    with pytest.raises(ValueError, match="L0"):
        CachedTokenizer(tokenizer, l0_max_entries=0)
    with pytest.raises(ValueError, match="L1"):
        CachedTokenizer(tokenizer, l1_max_memory=0)


def test_wrapping_follows_the_config() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    assert wrap_with_encode_cache(tokenizer, TokenizerCacheConfig()) is tokenizer  # off by default
    wrapped = wrap_with_encode_cache(tokenizer, TokenizerCacheConfig(enable_l1=True, l1_max_memory=4096))
    assert isinstance(wrapped, CachedTokenizer)
    stats = wrapped.stats()
    assert not stats.l0.enabled and stats.l1.enabled and stats.l1.max_memory_bytes == 4096


def test_the_rest_of_the_protocol_is_the_wrapped_tokenizers(fixture_tokenizer: Tokenizer) -> None:
    cached = CachedTokenizer(fixture_tokenizer, l0_max_entries=10)
    assert isinstance(cached, Tokenizer)
    ids = fixture_tokenizer.encode("Hello 世界 🎉").ids
    token = boundary_tokens(fixture_tokenizer)[0]
    assert cached.decode(ids) == fixture_tokenizer.decode(ids)
    assert cached.token_to_id(token) == fixture_tokenizer.token_to_id(token)
    assert cached.id_to_token(ids[0]) == fixture_tokenizer.id_to_token(ids[0])
    assert cached.vocab_size == fixture_tokenizer.vocab_size
    assert cached.special_tokens == fixture_tokenizer.special_tokens
    assert cached.special_token_ids == fixture_tokenizer.special_token_ids
    assert cached.eos_token_ids == fixture_tokenizer.eos_token_ids
    assert cached.name == fixture_tokenizer.name


def test_non_text_input_gets_the_backends_own_error() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    cached = CachedTokenizer(tokenizer, l0_max_entries=10, l1_max_memory=1 << 20)
    with pytest.raises(Exception) as uncached_error:
        tokenizer.encode(None)  # type: ignore[arg-type]
    with pytest.raises(uncached_error.type):
        cached.encode(None)  # type: ignore[arg-type]
