"""Differential tests of DecodeStream on canonical tokenizations of real texts, on every fixture tokenizer.

Each stream is checked after every step against an independent byte-accounting model (differential/oracle.py): the text
emitted so far must be exactly what can no longer change ("no late characters"), and everything emitted plus
flush() must equal the tokenizer's own decode (with a prompt: decode(prompt + gen)[len(decode(prompt)):]).
"""

from __future__ import annotations

import pytest
from differential.check import check_stream, cut_points_inside_characters, oracle
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from helpers.texts import load_texts, text_lines

from detok_worker.stream import DecodeStream

NAMES = sorted(FIXTURE_TOKENIZER_DIRS)
PATHS = ["fast", "generic"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_whole_texts_stream_to_their_decode(name: str, skip: bool, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    for text in load_texts().values():
        ids = tokenizer.encode(text, add_special_tokens=True).ids
        total = check_stream(name, [], ids, skip, path, per_step=False)
        assert total == tokenizer.decode(ids, skip)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_every_line_streams_without_late_characters(name: str, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    special = sorted(tokenizer.special_token_ids)
    previous: list[int] = []
    for number, (_, line) in enumerate(text_lines()):
        ids = tokenizer.encode(line).ids
        # Alternate skip settings and sprinkle a special token in, so both settings see special tokens.
        skip = number % 2 == 1
        generated = [*ids[:3], special[number % len(special)], *ids[3:]]
        check_stream(name, previous[-8:], generated, skip, path)
        previous = ids


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_prompt_cut_inside_a_character_leaks_nothing(name: str, path: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    texts = load_texts()
    checked = 0
    for text in (texts["emoji"], texts["cjk-big5hkscs"], texts["scripts"][:200], texts["cjk-gb18030"][:120]):
        ids = tokenizer.encode(text).ids
        full = tokenizer.decode(ids)  # not always `text`: Qwen normalizes to NFC
        for cut in cut_points_inside_characters(name, ids)[:12]:
            for skip in (False, True):
                streamed = check_stream(name, ids[:cut], ids[cut:], skip, path)
                # The split character is the prompt's: the output is the text after it, nothing of the prompt.
                assert full.endswith(streamed) and len(streamed) < len(full)
                checked += 1
    assert checked >= 12


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", ["qwen3", "deepseek-v3", "gpt-oss"])
def test_three_token_emoji_is_emitted_at_its_third_token(name: str, path: str) -> None:
    """The mini-sglang lesson: U+1FAE8 is three byte-level tokens; it must appear at the third, not at flush."""
    tokenizer = load_fixture_tokenizer(name)
    ids = tokenizer.encode("\U0001fae8").ids
    assert len(ids) == 3
    stream = DecodeStream(tokenizer, tokenizer.encode("Look: ").ids, force_generic=path == "generic")
    assert [stream.step(i) for i in ids] == [None, None, "\U0001fae8"]
    assert stream.flush() is None


@pytest.mark.parametrize("path", PATHS)
def test_byte_fallback_emoji_waits_for_its_run_to_end(path: str) -> None:
    """Byte-fallback tokenizers decode a run of <0xNN> tokens as a whole: the emoji can only be shown once a
    non-byte token (or flush) ends the run, because one more byte token could still turn it into U+FFFD."""
    tokenizer = load_fixture_tokenizer("mistral-sp-v1")
    ids = tokenizer.encode("\U0001fae8 ok").ids
    stream = DecodeStream(tokenizer, force_generic=path == "generic")
    pieces = [stream.step(i) for i in ids]
    assert "".join(p or "" for p in pieces) == "\U0001fae8 ok"
    assert pieces[-2] is None and pieces[-1] == "\U0001fae8 ok"
    run = [oracle("mistral-sp-v1").id_of_byte[b] for b in "\U0001fae8".encode()]
    stream = DecodeStream(tokenizer, force_generic=path == "generic")
    assert [stream.step(i) for i in run] == [None] * 4
    assert stream.flush() == "\U0001fae8"
