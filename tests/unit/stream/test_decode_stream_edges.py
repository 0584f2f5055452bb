"""DecodeStream edge cases: bad ids, bounded state, long runs of undecodable bytes, skipped specials, flush."""

from __future__ import annotations

import pytest
from differential.check import oracle
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from helpers.texts import load_texts

from detok_worker.stream import DecodeStream
from detok_worker.stream.decode.generic import MAX_HELD_TOKENS, PROMPT_CONTEXT_TOKENS
from detok_worker.tokenizer import InvalidTokenIdError

NAMES = sorted(FIXTURE_TOKENIZER_DIRS)
PATHS = ["fast", "generic"]
EMOJI = "\U0001fae8"  # three byte-level tokens on qwen3, deepseek-v3 and gpt-oss


def make(name: str, path: str, prompt: list[int] | tuple[int, ...] = (), skip: bool = False) -> DecodeStream:
    return DecodeStream(load_fixture_tokenizer(name), prompt, skip, force_generic=path == "generic")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_bad_ids_raise_and_leave_the_stream_unchanged(name: str, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    ids = tokenizer.encode("ok " + EMOJI + " done").ids
    split = next(k for k in range(1, len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd"))
    stream = make(name, path)
    before = [stream.step(i) for i in ids[:split]]  # stops inside the emoji
    for bad in (-1, tokenizer.vocab_size, 10**12):
        with pytest.raises(InvalidTokenIdError) as info:
            stream.step(bad)
        assert info.value.token_id == bad
        with pytest.raises(InvalidTokenIdError) as info:
            stream.step_batch([ids[split], bad, ids[split]])
        assert info.value.token_id == bad
    after = stream.step_batch(ids[split:])
    assert "".join(p or "" for p in before) + "".join(after) + (stream.flush() or "") == tokenizer.decode(ids)
    with pytest.raises(InvalidTokenIdError):
        make(name, path, prompt=[*ids, -5])


@pytest.mark.parametrize("path", PATHS)
def test_flush_releases_a_split_character_and_later_ids_continue(path: str) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    first, second, third = tokenizer.encode(EMOJI).ids
    stream = make("qwen3", path)
    assert stream.step(first) is None and stream.step(second) is None
    assert stream.flush() == "\ufffd"
    assert stream.flush() is None
    # The character was shown (as U+FFFD); completing it later does not show it again.
    assert stream.step(third) is None
    assert stream.step(tokenizer.token_to_id("x")) == "x"


@pytest.mark.parametrize("path", PATHS)
def test_skipped_special_token_inside_a_character_does_not_split_it(path: str) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    first, second, third = tokenizer.encode(EMOJI).ids
    eos = min(tokenizer.eos_token_ids)
    ids = [first, eos, second, third]
    skipping = make("qwen3", path, skip=True)
    assert [skipping.step(i) for i in ids] == [None, None, None, EMOJI]
    keeping = make("qwen3", path)
    streamed = [keeping.step(i) or "" for i in ids] + [keeping.flush() or ""]
    assert "".join(streamed) == tokenizer.decode(ids)
    assert "".join(streamed).startswith("\ufffd<|im_end|>\ufffd")


@pytest.mark.parametrize("path", PATHS)
def test_byte_fallback_run_spans_skipped_special_tokens(path: str) -> None:
    model = oracle("mistral-sp-v1")
    e4, bd, a0 = (model.id_of_byte[b] for b in "你".encode())
    bos = 1
    skipping = make("mistral-sp-v1", path, skip=True)
    assert [skipping.step(i) for i in (e4, bos, bd, a0)] == [None, None, None, None]
    assert skipping.flush() == "你"
    keeping = make("mistral-sp-v1", path)
    streamed = "".join(keeping.step_batch([e4, bos, bd, a0])) + (keeping.flush() or "")
    assert streamed == "\ufffd<s>\ufffd\ufffd"


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_byte_fallback_leading_space_is_stripped_once(path: str, skip: bool) -> None:
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    hello = tokenizer.encode("Hello world").ids
    stream = make("mistral-sp-v1", path, prompt=[1], skip=skip)
    streamed = "".join(stream.step_batch(hello)) + (stream.flush() or "")
    assert streamed == ("Hello world" if skip else " Hello world")
    assert streamed == tokenizer.decode([1, *hello], skip)[len(tokenizer.decode([1], skip)) :]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_retained_state_stays_bounded_on_long_streams(name: str, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    ids = tokenizer.encode("".join(load_texts().values())).ids * 3
    prompt = tokenizer.encode("The prompt.").ids
    stream = make(name, path, prompt=prompt)
    largest = 0
    pieces = []
    for token_id in ids:
        pieces.append(stream.step(token_id) or "")
        largest = max(largest, len(stream.tokens))
    pieces.append(stream.flush() or "")
    assert "".join(pieces) == tokenizer.decode(prompt + ids)[len(tokenizer.decode(prompt)) :]
    # Context plus a withheld tail: a character needs at most 4 ids, a byte-fallback run (the tag-sequence flag
    # here: 28 ids) all of its ids; the generic window may also still hold the previous run as context.
    longest_run = max_byte_run(name, ids)
    assert largest <= 2 * longest_run + 8


def max_byte_run(name: str, ids: list[int]) -> int:
    model = oracle(name)
    longest = current = 0
    for unit in model.units([], ids, False):
        current = current + 1 if unit.is_byte else 0
        longest = max(longest, current)
    return longest


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["qwen3", "gpt-oss"])
def test_long_run_of_invalid_bytes_is_exact_and_bounded(name: str, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    model = oracle(name)
    # A lone continuation byte: never part of a character, so each one is a U+FFFD of its own.
    stray = next(i for i in model.partial_ids if tokenizer.decode([i, i]) == "\ufffd\ufffd")
    x = tokenizer.token_to_id("x")
    ids = [x] + [stray] * 1000 + [x]
    stream = make(name, path)
    emitted = []
    largest = 0
    for k, token_id in enumerate(ids):
        emitted.append(stream.step(token_id) or "")
        largest = max(largest, len(stream.tokens))
        if k == 600:
            # Nothing is withheld for long: at most one window of U+FFFD is still pending.
            assert len("".join(emitted)) >= k - MAX_HELD_TOKENS - PROMPT_CONTEXT_TOKENS
    assert "".join(emitted) + (stream.flush() or "") == tokenizer.decode(ids)
    assert largest <= MAX_HELD_TOKENS + PROMPT_CONTEXT_TOKENS + 1


@pytest.mark.parametrize("path", PATHS)
def test_many_ids_that_decode_to_nothing_keep_the_window_small(path: str) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    eos = min(tokenizer.eos_token_ids)
    ids = tokenizer.encode("before ").ids + [eos] * 2000 + tokenizer.encode("after").ids
    stream = make("qwen3", path, skip=True)
    largest = 0
    pieces = []
    for token_id in ids:
        pieces.append(stream.step(token_id) or "")
        largest = max(largest, len(stream.tokens))
    assert "".join(pieces) + (stream.flush() or "") == "before after"
    assert largest <= 4


@pytest.mark.parametrize("name", NAMES)
def test_step_returns_none_not_empty_string(name: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    for path in PATHS:
        stream = make(name, path, skip=True)
        results = [stream.step(i) for i in sorted(tokenizer.special_token_ids)[:5]]
        assert results == [None] * len(results)
        specials = sorted(tokenizer.special_token_ids)[:3]  # gpt4o has only two
        assert stream.step_batch(specials) == [""] * len(specials)
        assert stream.flush() is None
