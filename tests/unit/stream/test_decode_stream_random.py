"""Hypothesis-driven streams of random ids (derandomized, so CI is deterministic) on every fixture tokenizer.

Ids are drawn mostly from the awkward ones: ids whose bytes are not complete UTF-8 on their own (partial
characters, byte-fallback byte tokens) and special ids; prompts may be empty or end anywhere, including inside a
character or a byte run. Both paths are checked step by step (test_decode_stream.check_stream) and against each
other; step_batch in random chunks must give the same text as step.
"""

from __future__ import annotations

from functools import cache

import pytest
from differential.check import check_stream, oracle, prompt_ends_in_byte_run
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detok_worker.stream import DecodeStream

NAMES = sorted(FIXTURE_TOKENIZER_DIRS)
SETTINGS = settings(
    max_examples=45,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@cache
def id_strategy(name: str) -> st.SearchStrategy[int]:
    tokenizer = load_fixture_tokenizer(name)
    model = oracle(name)
    text_ids = sorted(set(tokenizer.encode("Hello, world! 你好 🤗 ok\n  x").ids))
    pools = [
        st.sampled_from(model.partial_ids),
        st.sampled_from(sorted(tokenizer.special_token_ids)),
        st.integers(0, tokenizer.vocab_size - 1).filter(lambda i: i not in model.unknown_ids),
        st.sampled_from(text_ids),
    ]
    if model.byte_token_ids:
        pools.append(st.sampled_from(model.byte_token_ids))
    return st.one_of(pools)


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_random_ids_stream_exactly_on_both_paths(name: str, data: st.DataObject) -> None:
    ids = id_strategy(name)
    prompt = data.draw(st.lists(ids, max_size=6), label="prompt")
    generated = data.draw(st.lists(ids, min_size=1, max_size=24), label="generated")
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    fast = check_stream(name, prompt, generated, skip, "fast")
    generic = check_stream(name, prompt, generated, skip, "generic")
    if not prompt_ends_in_byte_run(name, prompt, generated, skip):
        assert fast == generic


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_step_batch_in_chunks_matches_step(name: str, data: st.DataObject) -> None:
    tokenizer = load_fixture_tokenizer(name)
    ids = id_strategy(name)
    prompt = data.draw(st.lists(ids, max_size=4), label="prompt")
    generated = data.draw(st.lists(ids, min_size=1, max_size=24), label="generated")
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    cuts = sorted(data.draw(st.sets(st.integers(1, len(generated)), max_size=5), label="cuts") | {len(generated)})
    for force_generic in (False, True):
        one_by_one = DecodeStream(tokenizer, prompt, skip, force_generic=force_generic)
        expected = [one_by_one.step(i) or "" for i in generated]
        batched = DecodeStream(tokenizer, prompt, skip, force_generic=force_generic)
        got: list[str] = []
        start = 0
        for cut in cuts:
            chunk = batched.step_batch(generated[start:cut])
            assert len(chunk) == cut - start
            got += chunk
            start = cut
        assert got == expected
        assert batched.flush() == one_by_one.flush()
