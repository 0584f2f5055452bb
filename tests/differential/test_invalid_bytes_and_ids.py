"""Invalid bytes and invalid ids while streaming, each case on at least two tokenizer families: a surrogate prefix,
every kind of bad id, skipped specials after a split character, long invalid byte runs."""

from __future__ import annotations

import pytest

from detok_worker.stream import DecodeStream, StopSequenceConfig, StopSequenceDecoder
from detok_worker.tokenizer.protocol import InvalidTokenIdError
from differential.cases import byte_ids
from differential.families import loaded


def _bytes(name: str, data: bytes) -> list[int]:
    by_byte = byte_ids(loaded(name)[1])
    return [by_byte[b] for b in data]


@pytest.mark.parametrize("name", ["gpt-oss", "qwen3", "deepseek-v3", "sentencepiece-v7"])
def test_surrogate_prefix_is_two_replacement_characters_at_once(name: str) -> None:
    tokenizer, _ = loaded(name)
    ed, a0 = _bytes(name, b"\xed\xa0")
    letter = _bytes(name, b"A")
    assert tokenizer.decode([ed, a0]) == "\ufffd\ufffd"
    stream = DecodeStream(tokenizer)
    assert [stream.step(ed), stream.step(a0)] == [None, "\ufffd\ufffd"]
    stream = DecodeStream(tokenizer, [ed, a0])  # the prompt's two U+FFFD are final: 0x80 is one more
    assert stream.step(_bytes(name, b"\x80")[0]) == "\ufffd"
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_sequences=("\ufffdA",)), prompt_ids=[ed, a0])
    assert decoder.process_tokens(letter).text == "A" and not decoder.stopped


BAD_IDS = ["-1", "-V", "-V-1", "-2V", "-2V-1", "V", "2V", 1.0, "1", None, True, False]


def _bad(value: object, size: int) -> object:
    if isinstance(value, str) and ("V" in value or value.startswith("-")):
        return eval(value.replace("2V", f"2*{size}").replace("V", str(size)))  # noqa: S307 - a fixed table
    return value


@pytest.mark.parametrize("name", ["gpt-oss", "qwen3", "mistral-sp-v1", "sentencepiece-v7"])
@pytest.mark.parametrize("raw", BAD_IDS, ids=str)
def test_every_bad_id_is_one_typed_error_everywhere(name: str, raw: object) -> None:
    tokenizer, _ = loaded(name)
    bad = _bad(raw, tokenizer.vocab_size)
    good = tokenizer.encode("hi").ids
    for force_generic in (False, True):
        stream = DecodeStream(tokenizer, force_generic=force_generic)
        for batch in ([bad], [*good, bad]):
            with pytest.raises(InvalidTokenIdError):
                stream.step_batch(batch)
        with pytest.raises(InvalidTokenIdError):
            stream.step(bad)
        assert "".join(stream.step_batch(good)) == tokenizer.decode(good)  # unchanged by the refusals
        with pytest.raises(InvalidTokenIdError):
            DecodeStream(tokenizer, [*good, bad], force_generic=force_generic)
    with pytest.raises(InvalidTokenIdError):
        tokenizer.decode([*good, bad])
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig())
    with pytest.raises(InvalidTokenIdError):
        decoder.process_token(bad)
    result = decoder.process_tokens([*good, bad])
    assert result.error and result.consumed == len(good)


# Not mistral-sp-v1 on the generic path: a Hugging Face byte run continued across the prompt is its documented limit.
SPLIT_CASES = [(n, g) for n in ("gpt-oss", "qwen3", "mistral-sp-v1", "sentencepiece-v7") for g in (False, True)]


@pytest.mark.parametrize(("name", "force_generic"), [c for c in SPLIT_CASES if c != ("mistral-sp-v1", True)])
def test_skipped_specials_after_a_split_character_never_leak_it(name: str, force_generic: bool) -> None:
    tokenizer, _ = loaded(name)
    euro = _bytes(name, "€".encode())
    letter = tokenizer.encode("ok").ids
    special = min(tokenizer.special_token_ids - tokenizer.eos_token_ids)
    expected = tokenizer.decode([*euro, *letter])[1:]  # the euro sign is the prompt's
    for count in (0, 62, 63, 64, 65, 127, 128, 129, 200, 300):
        prompt = [*euro[:2], *[special] * count]
        stream = DecodeStream(tokenizer, prompt, skip_special_tokens=True, force_generic=force_generic)
        streamed = [stream.step(euro[2]), *stream.step_batch(letter)]
        assert "".join(s or "" for s in streamed) + (stream.flush() or "") == expected, count


@pytest.mark.parametrize("name", ["sentencepiece-v1", "sentencepiece-v7"])
@pytest.mark.parametrize("invalid", [126, 127, 128, 200])
def test_long_invalid_byte_runs_keep_a_later_character_whole(name: str, invalid: int) -> None:
    tokenizer, _ = loaded(name)
    ids = [*_bytes(name, b"\x80") * invalid, *_bytes(name, "😀".encode()), *tokenizer.encode(" a").ids]
    stream = DecodeStream(tokenizer)
    steps = [stream.step(i) for i in ids]
    assert not stream.fast_path
    assert steps[:invalid] == ["\ufffd"] * invalid  # each invalid byte is final at once
    assert steps[invalid : invalid + 3] == [None] * 3 and steps[invalid + 3] == "😀"
    assert "".join(s or "" for s in steps) + (stream.flush() or "") == tokenizer.decode(ids)
