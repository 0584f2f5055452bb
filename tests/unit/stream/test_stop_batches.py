"""StopSequenceDecoder: batches, invalid ids, lifecycle (reset, pass-through) and config validation."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.stop_checks import TOKENIZERS, check, single_token_pieces

from detok_worker.errors import ParameterError
from detok_worker.stream import Held, Stopped, StopSequenceConfig, StopSequenceDecoder
from detok_worker.tokenizer.protocol import InvalidTokenIdError

# ---------------------------------------------------------------------------------------------------------------
# Batches, errors, lifecycle


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
def test_process_tokens_equals_process_token(tokenizer_name: str) -> None:
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    ids = tokenizer.encode("The quick 🫨 brown fox jumps; over the lazy dog. THE END and more").ids
    config = StopSequenceConfig(stop_sequences=["lazy dog", "fox", "🫨 b"], visible_stop_sequences=["jumps"])
    for size in (1, 2, 3, 5, len(ids)):
        one = StopSequenceDecoder(tokenizer, config)
        single = [one.process_token(i) for i in ids]
        many = StopSequenceDecoder(tokenizer, config)
        batches = [many.process_tokens(ids[k : k + size]) for k in range(0, len(ids), size)]
        assert "".join(b.text for b in batches) == "".join(o.text for o in single)
        assert many.stop_reason == one.stop_reason == "🫨 b"
        assert sum(b.consumed for b in batches) == one.num_generated == many.num_generated
        stopped_at = next(k for k, b in enumerate(batches) if b.stopped)
        assert all(b.stopped and not b.text and b.consumed == 0 for b in batches[stopped_at + 1 :])


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
@pytest.mark.parametrize("min_tokens", [0, 9])
def test_process_one_equals_process_tokens_of_one(tokenizer_name: str, min_tokens: int) -> None:
    """The worker's fused call: same text, stop and count per id as process_tokens((id,)), through a stop string
    held over several ids, a stop token (EOS) and a bad id."""
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    text = "The quick 🫨 brown fox jumps; over the lazy dog. THE END and more"
    eos = min(tokenizer.eos_token_ids)
    ids = tokenizer.encode(text).ids
    bad = tokenizer.vocab_size + 7
    cases = (((), [eos, *ids], eos), (("lazy dog",), ids, "lazy dog"), (("zzz", "fox x"), [bad, *ids], None))
    for stops, tail, reason in cases:
        config = StopSequenceConfig(stop_tokens=[eos], stop_sequences=stops)
        fused = StopSequenceDecoder(tokenizer, config, min_tokens=min_tokens)
        plain = StopSequenceDecoder(tokenizer, config, min_tokens=min_tokens)
        errors = 0
        for token_id in [*ids, *tail]:
            got, want = fused.process_one(token_id), plain.process_tokens((token_id,))
            if isinstance(got, str):
                assert (got, False, None) == (want.text, want.stopped, want.error)
            else:
                assert got == want
                errors += got.error is not None
        assert fused.stop_reason == plain.stop_reason == reason
        assert errors == (reason is None)
        assert fused.num_generated == plain.num_generated


def test_invalid_id_mid_batch() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("good text").ids
    config = StopSequenceConfig(stop_sequences=["zzz"])
    decoder = StopSequenceDecoder(tokenizer, config)
    result = decoder.process_tokens([*ids, tokenizer.vocab_size + 7, *ids])
    assert result.text == "good text"
    assert result.consumed == len(ids)
    assert result.error is not None and str(tokenizer.vocab_size + 7) in result.error
    assert not result.stopped
    assert decoder.num_generated == len(ids)
    # the decoder carries on as if the bad id had never been sent
    assert decoder.process_tokens(ids).text == "good text"


@pytest.mark.parametrize("bad_id", [-1, 10**9])
def test_invalid_id_single_raises_and_leaves_state(bad_id: int) -> None:

    tokenizer = load_fixture_tokenizer("qwen3")
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_sequences=["<|END|>"]))
    ids = single_token_pieces(["a", " <", "|"])
    assert "".join(decoder.process_token(i).text for i in ids) == "a "
    with pytest.raises(InvalidTokenIdError) as info:
        decoder.process_token(bad_id)
    assert info.value.token_id == bad_id
    assert decoder.held_text == "<|"
    assert decoder.num_generated == 3
    rest = single_token_pieces(["END", "|", ">"])
    assert [decoder.process_token(i) for i in rest] == [Held(), Held(), Stopped("<|END|>")]


def test_no_stops_passes_text_through() -> None:
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    text = "Plain text 🫨 with 日本語"
    ids = tokenizer.encode(text).ids
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig())
    result = decoder.process_tokens(ids)
    assert result.text + decoder.flush().text == tokenizer.decode(ids)
    assert not result.stopped and result.consumed == len(ids) and decoder.num_generated == len(ids)


def test_prompt_context_is_used() -> None:
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    prompt = tokenizer.encode("Question: say it").ids
    full = tokenizer.encode("Question: say it now and stop then").ids
    assert full[: len(prompt)] == prompt
    ids = full[len(prompt) :]
    expected = check("mistral-sp-v1", ids, StopSequenceConfig(stop_sequences=["stop"]), prompt_ids=prompt)
    assert (expected.text, expected.stop_reason) == (" now and ", "stop")


def test_reset_starts_over() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("one two three").ids
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_sequences=[" two"]), min_tokens=1)
    first = decoder.process_tokens(ids)
    assert (first.text, first.stop_reason, decoder.stopped) == ("one", " two", True)
    decoder.reset()
    assert not decoder.stopped and decoder.num_generated == 0 and decoder.stop_reason is None
    assert decoder.process_tokens(ids) == first


@pytest.mark.parametrize(
    "kwargs",
    [
        {"stop_sequences": [""]},
        {"visible_stop_sequences": ["ok", ""]},
        {"stop_sequences": "abc"},
        {"stop_sequences": [3]},
        {"stop_tokens": [-1]},
        {"stop_tokens": ["5"]},
        {"stop_tokens": [True]},
        {"stop_sequences": ["x"], "visible_stop_sequences": ["x"]},
        {"stop_tokens": [5], "visible_stop_tokens": [5]},
    ],
)
def test_bad_config_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ParameterError):
        StopSequenceConfig(**kwargs)


def test_bad_decoder_options_are_rejected() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    with pytest.raises(ParameterError):
        StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_tokens=[tokenizer.vocab_size]))
    with pytest.raises(ParameterError):
        StopSequenceDecoder(tokenizer, StopSequenceConfig(), min_tokens=-1)


def test_config_is_immutable_and_deduplicated() -> None:
    config = StopSequenceConfig(stop_sequences=["a", "b", "a"], stop_tokens=[3, 3])
    assert config.stop_sequences == ("a", "b") and config.stop_tokens == (3,)
    with pytest.raises(AttributeError):
        config.stop_sequences = ("c",)  # type: ignore[misc]
    assert StopSequenceConfig(stop_sequences=["a", "b"]) == config.__class__(stop_sequences=("a", "b"))
