"""Sequence: a growing token sequence whose text() is always decode(token_ids)."""

from __future__ import annotations

import pytest
from differential.check import oracle
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from helpers.texts import load_texts

from detok_worker.stream import Sequence
from detok_worker.tokenizer import InvalidTokenIdError

NAMES = sorted(FIXTURE_TOKENIZER_DIRS)
PATHS = ["fast", "generic"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_appended_tokens_return_exactly_the_completed_text(name: str, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    model = oracle(name)
    ids = tokenizer.encode(load_texts()["emoji"][:120] + load_texts()["cjk-gb18030"][:40]).ids
    # Start inside a character, so the first appended ids complete one the initial ids began.
    cut = next(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd"))
    sequence = Sequence(tokenizer, ids[:cut], force_generic=path == "generic")
    assert sequence.fast_path == (path == "fast")
    assert sequence.text() == tokenizer.decode(ids[:cut])
    # What the initial ids already made final (the generic algorithm also withholds a trailing U+FFFD run).
    emitted = model.expected_final_so_far([], ids[:cut], False)
    if path == "generic":
        emitted = emitted.rstrip("\ufffd")
    for k in range(cut, len(ids)):
        returned = sequence.append_token(ids[k])
        assert sequence.token_ids == tuple(ids[: k + 1])
        assert sequence.text() == tokenizer.decode(ids[: k + 1])
        emitted += returned
        final_so_far = model.expected_final_so_far([], ids[: k + 1], False)
        if path == "fast":
            assert emitted == final_so_far
        else:
            assert final_so_far.startswith(emitted) and set(final_so_far[len(emitted) :]) <= {"\ufffd"}
    assert len(sequence) == len(ids)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_appended_text_is_context_not_output(name: str, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    sequence = Sequence(tokenizer, tokenizer.encode("User: hi").ids, force_generic=path == "generic")
    before = len(sequence)
    sequence.append_text("\nTool result: 42 ✓\n")
    assert len(sequence) == before + len(tokenizer.encode("\nTool result: 42 ✓\n").ids)
    assert sequence.text() == tokenizer.decode(list(sequence.token_ids))
    answer = tokenizer.encode(" The answer is 42.").ids
    returned = "".join(sequence.append_token(i) for i in answer)
    whole = tokenizer.decode(list(sequence.token_ids))
    assert whole.endswith(returned) and "Tool result" not in returned
    assert returned.strip() == "The answer is 42."
    assert sequence.text() == whole


@pytest.mark.parametrize("path", PATHS)
def test_bad_id_is_rejected_and_nothing_is_appended(path: str) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    first, second, third = tokenizer.encode("\U0001fae8").ids
    sequence = Sequence(tokenizer, [first], force_generic=path == "generic")
    for bad in (-1, tokenizer.vocab_size):
        with pytest.raises(InvalidTokenIdError):
            sequence.append_token(bad)
    with pytest.raises(InvalidTokenIdError):
        Sequence(tokenizer, [first, -3])
    assert sequence.token_ids == (first,)
    assert sequence.text() == "\ufffd"
    assert sequence.append_token(second) == ""
    assert sequence.append_token(third) == "\U0001fae8"
    assert sequence.text() == "\U0001fae8"


def test_skip_special_tokens_applies_to_text_and_returns() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    eos = min(tokenizer.eos_token_ids)
    sequence = Sequence(tokenizer, tokenizer.encode("a").ids, skip_special_tokens=True)
    assert sequence.append_token(eos) == ""
    assert sequence.append_token(tokenizer.token_to_id("b")) == "b"
    assert sequence.text() == "ab" == tokenizer.decode(list(sequence.token_ids), skip_special_tokens=True)
