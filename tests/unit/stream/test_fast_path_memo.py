"""The byte-level fast path's shared feed memo ((pending bytes, id) -> (text, pending after), one per decode table):
streams that find their steps already memoized by other streams, or whose memo is cleared under them, emit exactly
what the tokenizer's decode gives; a bad id is never memoized and leaves the stream as it was."""

from __future__ import annotations

import pytest
from helpers.fixtures import REPO, load_fixture_tokenizer

from detok_worker.stream import DecodeStream, byte_decoding_for
from detok_worker.stream.decode import byte_level as fast_byte_level
from detok_worker.tokenizer.protocol import InvalidTokenIdError

BYTE_LEVEL = ["qwen3", "deepseek-v3", "gpt-oss"]
TEXTS = REPO / "tests" / "fixtures" / "texts"


def multilingual_ids(tokenizer) -> list[int]:
    text = "\n".join((TEXTS / name).read_text(encoding="utf-8")[:1500] for name in ("emoji.txt", "scripts.txt"))
    return tokenizer.encode(text).ids


def stream_text(tokenizer, ids: list[int], prompt: list[int], *, one_by_one: bool) -> str:
    stream = DecodeStream(tokenizer, prompt)
    if one_by_one:
        pieces = [stream.step(token_id) or "" for token_id in ids]
    else:
        pieces = ["".join(stream.step_batch([token_id])) for token_id in ids]
    return "".join(pieces) + (stream.flush() or "")


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_memoized_steps_give_the_decode(name: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    memo = byte_decoding_for(tokenizer).keep.feed_memo
    ids = multilingual_ids(tokenizer)
    prompt = ids[:5]
    expected = tokenizer.decode(prompt + ids[5:])[len(tokenizer.decode(prompt)) :]
    memo.clear()
    cold = stream_text(tokenizer, ids[5:], prompt, one_by_one=True)
    assert memo, "the multilingual text has characters split across tokens: some steps were memoized"
    warm = stream_text(tokenizer, ids[5:], prompt, one_by_one=True)  # every off-lookup step is a memo hit now
    batched = stream_text(tokenizer, ids[5:], prompt, one_by_one=False)
    assert cold == warm == batched == expected


def test_a_full_memo_is_cleared_and_streams_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    memo = byte_decoding_for(tokenizer).keep.feed_memo
    monkeypatch.setattr(fast_byte_level, "_FEED_MEMO_MAX", 8)
    memo.clear()
    ids = multilingual_ids(tokenizer)
    assert stream_text(tokenizer, ids, [], one_by_one=True) == tokenizer.decode(ids)
    assert 0 < len(memo) <= 8


def test_a_bad_id_after_a_split_character_is_not_memoized() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    tables = byte_decoding_for(tokenizer).keep
    ids = multilingual_ids(tokenizer)
    split = next(k for k, token_id in enumerate(ids) if tables.texts[token_id] is None)  # leaves bytes pending
    stream = DecodeStream(tokenizer)
    pieces = [stream.step(token_id) or "" for token_id in ids[: split + 1]]
    assert stream.pending_text()
    entries = len(tables.feed_memo)
    for bad in (tokenizer.vocab_size + 5, -1):
        with pytest.raises(InvalidTokenIdError):
            stream.step(bad)
    assert len(tables.feed_memo) == entries
    pieces += [stream.step(token_id) or "" for token_id in ids[split + 1 :]]
    assert "".join(pieces) + (stream.flush() or "") == tokenizer.decode(ids)


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_a_prompt_ending_inside_a_character_with_a_warm_memo(name: str) -> None:
    """The character the prompt's last bytes complete belongs to the prompt, memo hit or not."""
    tokenizer = load_fixture_tokenizer(name)
    tables = byte_decoding_for(tokenizer).keep
    ids = multilingual_ids(tokenizer)
    split = next(k for k, token_id in enumerate(ids) if tables.texts[token_id] is None)
    prompt, generated = ids[: split + 1], ids[split + 1 :]
    expected = tokenizer.decode(prompt + generated)[len(tokenizer.decode(prompt)) :]
    tables.feed_memo.clear()
    for one_by_one in (True, True, False):  # cold, warm, warm through step_batch
        assert stream_text(tokenizer, generated, prompt, one_by_one=one_by_one) == expected
