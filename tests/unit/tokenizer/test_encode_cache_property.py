"""Property and churn tests of the encode cache: random concatenations of special tokens and text encode exactly
as uncached (hypothesis, with one long-lived cache per tokenizer so earlier examples produce hits), and the L1
memory bound holds under churn, measured with tracemalloc."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest
from helpers.encode_cache_corpus import boundary_tokens
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detok_worker.tokenizer.encode_cache import CachedTokenizer, split_plan_for

TEXT_PIECES = [
    " ",
    "  ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    "hello",
    " world",
    "Hello",
    "user\n",
    "assistant\n",
    "system\n",
    "你好",
    "世界",
    "🎉",
    "👨‍👩‍👧",
    "\u0301",
    "e",
    "▁",
    "Ġ",
    "<",
    ">",
    "|",
    "[INST]",
    "123",
    "'s",
    "def f():",
]

_caches: dict[str, CachedTokenizer] = {}


def shared_cache(name: str) -> CachedTokenizer:
    if name not in _caches:
        _caches[name] = CachedTokenizer(load_fixture_tokenizer(name), l0_max_entries=64, l1_max_memory=2 << 20)
    return _caches[name]


def pieces_for(name: str) -> st.SearchStrategy[list[str]]:
    tokenizer = load_fixture_tokenizer(name)
    specials = boundary_tokens(tokenizer)[:8]
    near_misses = [token[:-1] for token in specials[:2]] + [token[1:] for token in specials[:2]]
    piece = st.one_of(
        st.sampled_from(specials),
        st.sampled_from(TEXT_PIECES + near_misses),
        st.text(max_size=6),
    )
    return st.lists(piece, max_size=14)


@pytest.mark.parametrize("name", sorted(FIXTURE_TOKENIZER_DIRS))
def test_random_concatenations_encode_exactly(name: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    cached = shared_cache(name)

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(pieces=pieces_for(name), split=st.integers(min_value=0, max_value=14), flag=st.booleans())
    def check(pieces: list[str], split: int, flag: bool) -> None:
        # the shorter text first (a miss that caches its prefixes), then the longer one (a hit on them)
        for text in ("".join(pieces[:split]), "".join(pieces)):
            got, want = cached.encode(text, flag), tokenizer.encode(text, flag)
            assert (got.ids, got.offsets) == (want.ids, want.offsets)

    check()
    stats = cached.stats().l1
    assert stats.enabled and stats.hits > 0 and stats.unaligned == 0


def ascii_conversation(rng: random.Random, start: str, end: str) -> str:
    words = ["alpha", "beta", "gamma", "delta", "code()", "{x}", "12345", "  ", "\n"]
    text = f"{start}system\nSystem prompt number {rng.randrange(7)}.{end}\n"
    for _ in range(rng.randint(1, 8)):
        for role in ("user", "assistant"):
            body = " ".join(rng.choice(words) for _ in range(rng.randint(1, 60)))
            text += f"{start}{role}\n{body}{end}\n"
    return text


@pytest.mark.parametrize("budget", [64 * 1024, 1024 * 1024])
def test_l1_memory_stays_under_its_bound_under_churn(budget: int) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    split_plan_for(tokenizer)  # computed once per tokenizer; not part of the cache's memory
    rng = random.Random(budget)
    texts = [ascii_conversation(rng, "<|im_start|>", "<|im_end|>") for _ in range(150)]  # ASCII: no UTF-8 copies
    prompts = [prompt for text in texts for prompt in (text, text + "<|im_start|>user\nmore<|im_end|>\n")]
    expected = [encoding.ids for encoding in tokenizer.encode_batch(prompts)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cached = CachedTokenizer(tokenizer, l1_max_memory=budget)
        for prompt, want in zip(prompts, expected, strict=True):
            assert cached.encode(prompt).ids == want
            assert cached.stats().l1.memory_bytes <= budget
        del prompt, want
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stats = cached.stats().l1
    assert stats.evictions > 0 and stats.hits > 0
    assert retained <= stats.memory_bytes + 16 * 1024  # what the cache really holds is within what it counts
    cached.clear_cache()
    assert cached.stats().l1.memory_bytes == 0 and cached.stats().l1.entries == 0
