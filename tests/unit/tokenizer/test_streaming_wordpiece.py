"""Streaming a WordPiece tokenizer (bert-base-uncased, the bert-wordpiece fixture): its decoder joins words with
spaces and drops "##", so it has no byte semantics and the byte oracle does not apply; the truth is the tokenizer's
own decode. Every text streams to exactly its decode, with and without a prompt, and per step everything emitted
is a prefix of the decode so far."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.texts import load_texts, text_lines

from detok_worker.stream import DecodeStream, fast_path_status


@pytest.fixture(scope="module")
def bert():
    return load_fixture_tokenizer("bert-wordpiece")


def test_known_ids_and_no_fast_path(bert) -> None:
    ids = bert.encode("Hello, world! unaffable", add_special_tokens=True).ids
    assert ids == [101, 7592, 1010, 2088, 999, 14477, 20961, 3468, 102]
    assert bert.decode(ids, skip_special_tokens=True) == "hello, world! unaffable"
    assert fast_path_status(bert).decoding is None


@pytest.mark.parametrize("skip", [False, True])
def test_texts_stream_to_their_decode(bert, skip: bool) -> None:
    for text in load_texts().values():
        ids = bert.encode(text, add_special_tokens=True).ids
        for cut in (0, 1, 4, len(ids) // 2):
            stream = DecodeStream(bert, ids[:cut], skip)
            streamed = "".join(stream.step_batch(ids[cut:])) + (stream.flush() or "")
            assert streamed == bert.decode(ids, skip)[len(bert.decode(ids[:cut], skip)) :], (text[:40], cut)


def test_lines_emit_only_final_text(bert) -> None:
    for number, (_, line) in enumerate(text_lines()[::2]):
        ids = bert.encode(line, add_special_tokens=True).ids
        skip = number % 2 == 1
        stream = DecodeStream(bert, [], skip)
        emitted = ""
        for k, token_id in enumerate(ids):
            emitted += stream.step(token_id) or ""
            assert bert.decode(ids[: k + 1], skip).startswith(emitted), (line[:40], k)
        assert emitted + (stream.flush() or "") == bert.decode(ids, skip)
