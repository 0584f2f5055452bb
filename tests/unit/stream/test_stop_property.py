"""Property test: StopSequenceDecoder against the naive reference model over random texts, stop lists, token ids,
min_tokens and batch splits, on a byte-level BPE (Qwen3) and a byte-fallback SentencePiece (Mistral) tokenizer."""

from __future__ import annotations

import random

from helpers.fixtures import load_fixture_tokenizer
from helpers.stop_checks import reference, run_one_by_one
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from detok_worker.stream import StopSequenceConfig, StopSequenceDecoder

TOKENIZERS = ["qwen3", "mistral-sp-v1"]
CHARS = ["a", "b", " ", "<", "|", ">", "\n", "é", "日", "本", "🫨", "👩", "\u200d", "😀"]


@st.composite
def cases(draw: st.DrawFn) -> tuple:
    tokenizer_name = draw(st.sampled_from(TOKENIZERS))
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    text = draw(st.text(st.sampled_from(CHARS), max_size=24))
    ids = tokenizer.encode(text).ids
    spliced = draw(st.booleans())
    if spliced:  # splice in random ids: partial characters, special tokens, anything
        for _ in range(draw(st.integers(1, 4))):
            ids.insert(draw(st.integers(0, len(ids))), draw(st.integers(0, tokenizer.vocab_size - 1)))
    decoded = tokenizer.decode(ids)

    def stop_string() -> str:
        if decoded and draw(st.booleans()):  # a piece of the real text, so that it matches
            start = draw(st.integers(0, len(decoded) - 1))
            return decoded[start : start + draw(st.integers(1, 4))]
        return draw(st.text(st.sampled_from(CHARS), min_size=1, max_size=4))

    stops = list(dict.fromkeys(stop_string() for _ in range(draw(st.integers(0, 4)))))
    n_visible = draw(st.integers(0, len(stops)))
    stop_tokens: list[int] = []
    visible_stop_tokens: list[int] = []
    if ids and draw(st.booleans()):
        stop_tokens.append(draw(st.sampled_from(ids)))
    # A visible stop token that is a piece of a character has no text of its own; leave that to the table tests.
    whole = [i for i in ids if "\ufffd" not in tokenizer.decode([i]) and i not in stop_tokens]
    if whole and draw(st.booleans()):
        visible_stop_tokens.append(draw(st.sampled_from(whole)))
    config = StopSequenceConfig(
        stop_tokens=stop_tokens,
        stop_sequences=stops[n_visible:],
        visible_stop_tokens=visible_stop_tokens,
        visible_stop_sequences=stops[:n_visible],
    )
    min_tokens = draw(st.integers(0, len(ids) + 1))
    # A prompt of whole characters (random ids right after a prompt are the DecodeStream tests' business).
    prompt_ids = [] if spliced else tokenizer.encode(draw(st.text(st.sampled_from(CHARS), max_size=6))).ids
    skip = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return tokenizer_name, ids, config, min_tokens, prompt_ids, skip, seed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_decoder_matches_reference(case: tuple) -> None:
    tokenizer_name, ids, config, min_tokens, prompt_ids, skip, seed = case
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    expected = reference(tokenizer, ids, config, min_tokens, prompt_ids, skip)
    event("stop: " + ("none" if expected.stop_reason is None else type(expected.stop_reason).__name__))
    options = {"prompt_ids": prompt_ids, "skip_special_tokens": skip, "min_tokens": min_tokens}
    one_by_one = StopSequenceDecoder(tokenizer, config, **options)
    assert run_one_by_one(tokenizer, one_by_one, ids, prompt_ids, expected, skip) == expected

    # Random batch splits give the same text, stop and consumed count.
    rng = random.Random(seed)
    batched = StopSequenceDecoder(tokenizer, config, **options)
    text = ""
    consumed = 0
    position = 0
    while position < len(ids):
        size = rng.randint(1, 6)
        result = batched.process_tokens(ids[position : position + size])
        text += result.text
        consumed += result.consumed
        position += size
        if result.stopped:
            break
    if not batched.stopped:
        text += batched.flush().text
    assert (text, batched.stop_reason) == (expected.text, expected.stop_reason)
    assert consumed == expected.consumed == batched.num_generated
