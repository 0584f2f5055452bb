"""Checks shared by the stop-decoder tests: a naive reference and the per-piece runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from detok_worker.stream import (
    DecodeStream,
    Held,
    Stopped,
    StoppedWithText,
    StopSequenceConfig,
    StopSequenceDecoder,
)
from helpers.fixtures import load_fixture_tokenizer

TOKENIZERS = ["qwen3", "mistral-sp-v1"]


@dataclass
class Expected:
    text: str
    stop_reason: str | int | None
    consumed: int  # ids processed up to and including the one that completed the stop (all ids if none)


def stream_lengths(tokenizer, ids: Sequence[int], prompt_ids: Sequence[int] = (), skip: bool = False) -> list[int]:
    """lengths[k]: characters a plain DecodeStream has released after k ids (the text that exists by then)."""
    stream = DecodeStream(tokenizer, prompt_ids, skip)
    lengths = [0]
    for token_id in ids:
        lengths.append(lengths[-1] + len(stream.step(token_id) or ""))
    return lengths


def reference(
    tokenizer,
    ids: Sequence[int],
    config: StopSequenceConfig,
    min_tokens: int = 0,
    prompt_ids: Sequence[int] = (),
    skip: bool = False,
) -> Expected:
    """The naive model of the stop rules, on full decodes (skip: skip_special_tokens)."""
    prompt_text = tokenizer.decode(list(prompt_ids), skip)

    def decoded(count: int) -> str:
        return tokenizer.decode([*prompt_ids, *ids[:count]], skip)[len(prompt_text) :]

    stop_ids = {*config.stop_tokens, *config.visible_stop_tokens}
    stop_index = next((k for k in range(min_tokens, len(ids)) if ids[k] in stop_ids), None)
    body = len(ids) if stop_index is None else stop_index
    text = decoded(body)
    lengths = stream_lengths(tokenizer, ids[:body], prompt_ids, skip)
    boundary = lengths[min_tokens] if body > min_tokens else len(text)
    best: tuple[int, int, str] | None = None
    for stop in (*config.stop_sequences, *config.visible_stop_sequences):
        start = text.find(stop)
        while start >= 0:
            end = start + len(stop)
            if end > boundary and (best is None or (end, start) < best[:2]):
                best = (end, start, stop)
            start = text.find(stop, start + 1)
    if best is not None:
        end, start, stop = best
        # the id whose text completes the match; text only the final flush releases counts for the last id, or
        # for the stop token whose arrival ended the stream
        consumed = next((k for k in range(1, body + 1) if lengths[k] >= end), len(ids[: body + 1]))
        return Expected(text[:end] if stop in config.visible_stop_sequences else text[:start], stop, consumed)
    if stop_index is None:
        return Expected(text, None, len(ids))
    if ids[stop_index] in config.visible_stop_tokens:
        # its own text, in context: what it adds to the text before it (nothing if it only completes a character
        # begun before it, which then stays U+FFFD: the text before a stop token ends where the token starts)
        with_token = decoded(stop_index + 1)
        text += with_token[len(text) :] if with_token.startswith(text) else ""
    return Expected(text, ids[stop_index], stop_index + 1)


def run_one_by_one(
    tokenizer,
    decoder: StopSequenceDecoder,
    ids: Sequence[int],
    prompt_ids: Sequence[int],
    expected: Expected,
    skip: bool = False,
) -> Expected:
    """process_token per id, then flush, checking after every step that nothing leaks and nothing is late."""
    stops = [*decoder.config.stop_sequences, *decoder.config.visible_stop_sequences]
    stream = DecodeStream(tokenizer, prompt_ids, skip)  # gives the text that exists after each id
    existing = released = ""
    consumed = len(ids)
    for index, token_id in enumerate(ids):
        output = decoder.process_token(token_id)
        released += output.text
        assert expected.text.startswith(released)  # nothing that is later cut off is ever released
        if isinstance(output, Stopped | StoppedWithText):
            consumed = index + 1
            break
        assert isinstance(output, Held) == (output.text == "")
        existing += stream.step(token_id) or ""
        # Nothing is late: only the longest suffix that may start a stop string is held back.
        assert released + decoder.held_text == existing
        if stops:
            assert decoder.held_text == reference_hold(existing, stops)
    else:
        released += decoder.flush().text
    if decoder.stopped:  # every later call says Stopped
        assert decoder.process_token(ids[0]) == Stopped(decoder.stop_reason)
        assert decoder.flush() == Stopped(decoder.stop_reason)
    return Expected(released, decoder.stop_reason, consumed)


def check(
    tokenizer_name: str,
    ids: Sequence[int],
    config: StopSequenceConfig,
    min_tokens: int = 0,
    prompt_ids: Sequence[int] = (),
) -> Expected:
    """Run the decoder one id at a time and in one batch; both must equal the reference. Returns it."""
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    expected = reference(tokenizer, ids, config, min_tokens, prompt_ids)
    decoder = StopSequenceDecoder(tokenizer, config, prompt_ids=prompt_ids, min_tokens=min_tokens)
    assert run_one_by_one(tokenizer, decoder, ids, prompt_ids, expected) == expected
    batch = StopSequenceDecoder(tokenizer, config, prompt_ids=prompt_ids, min_tokens=min_tokens)
    result = batch.process_tokens(list(ids))
    text = result.text + (batch.flush().text if not result.stopped else "")
    assert (text, batch.stop_reason) == (expected.text, expected.stop_reason)
    if result.stopped:
        assert result.consumed == expected.consumed
    return expected


def piece_ids(pieces: Sequence[str]) -> list[list[int]]:
    """Qwen3 ids of each piece encoded on its own: token boundaries fall at every piece boundary (byte-level
    BPE decodes to the plain concatenation)."""
    tokenizer = load_fixture_tokenizer("qwen3")
    groups = [tokenizer.encode(piece).ids for piece in pieces]
    assert tokenizer.decode([i for group in groups for i in group]) == "".join(pieces)
    return groups


def encode_pieces(pieces: Sequence[str]) -> list[int]:
    return [i for group in piece_ids(pieces) for i in group]


def single_token_pieces(pieces: Sequence[str]) -> list[int]:
    """Like encode_pieces, for pieces that must each be one Qwen3 token."""
    groups = piece_ids(pieces)
    assert all(len(group) == 1 for group in groups), groups
    return [group[0] for group in groups]


def reference_hold(text: str, stops: list[str]) -> str:
    """The longest suffix of text that is a proper prefix of some stop string."""
    for size in range(min(len(text), max(map(len, stops))), 0, -1):
        suffix = text[-size:]
        if any(len(stop) > size and stop.startswith(suffix) for stop in stops):
            return suffix
    return ""
