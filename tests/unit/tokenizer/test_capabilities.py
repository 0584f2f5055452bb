"""The optional tokenizer capabilities (tokenizer/protocol.py) are recognised on the backends that have them and
on the wrappers in front of them, and a tokenizer's id rule is its own where it has one."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from prometheus_client import CollectorRegistry

from detok_worker.metrics import InstrumentedTokenizer, Metrics
from detok_worker.metrics.families import tokenizer_type
from detok_worker.tokenizer.encode_cache import CachedTokenizer
from detok_worker.tokenizer.protocol import (
    BuildsLazily,
    ChecksIds,
    DecodesBatch,
    Fingerprinted,
    HasTokenBytes,
    InvalidTokenIdError,
    KnowsAddedTokens,
    WrapsTokenizer,
    added_token_contents,
    id_check,
)


def test_the_hf_backend_has_every_capability() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    for capability in (ChecksIds, DecodesBatch, KnowsAddedTokens, BuildsLazily, Fingerprinted, HasTokenBytes):
        assert isinstance(tokenizer, capability), capability.__name__
    assert not isinstance(tokenizer, WrapsTokenizer)
    assert added_token_contents(tokenizer)


def test_wrappers_are_recognised_and_report_what_they_wrap() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    cached = CachedTokenizer(tokenizer, l0_max_entries=8)
    instrumented = InstrumentedTokenizer(cached, Metrics(CollectorRegistry()))
    assert isinstance(cached, WrapsTokenizer) and isinstance(instrumented, WrapsTokenizer)
    assert tokenizer_type(instrumented) == tokenizer_type(tokenizer) == "hf"
    assert instrumented.vocab_size == tokenizer.vocab_size
    assert instrumented.encode("Hello").ids == tokenizer.encode("Hello").ids


@pytest.mark.parametrize(("family", "gap"), [("gpt35turbo", 100256), ("qwen3", None)])
def test_id_check_is_the_tokenizers_own_rule(family: str, gap: int | None) -> None:
    tokenizer = load_fixture_tokenizer(family)
    check = id_check(tokenizer)
    check([0, tokenizer.vocab_size - 1])
    with pytest.raises(InvalidTokenIdError):
        check([tokenizer.vocab_size])
    with pytest.raises(InvalidTokenIdError):
        check([True])
    if gap is not None:  # inside the range, but no token
        with pytest.raises(InvalidTokenIdError):
            check([gap])
