"""Checks shared by the streaming-core tests: the decode oracle and the per-step stream check."""

from __future__ import annotations

from functools import cache

from detok_worker.stream import DecodeStream
from helpers.fixtures import load_fixture_tokenizer
from helpers.stream_oracle import ByteOracle, incomplete_tail_length

REPLACEMENT = "\ufffd"


@cache
def oracle(name: str) -> ByteOracle:
    return ByteOracle(load_fixture_tokenizer(name))


def literal_expected(tokenizer, prompt: list[int], generated: list[int], skip: bool) -> str:
    return tokenizer.decode(prompt + generated, skip)[len(tokenizer.decode(prompt, skip)) :]


def prompt_ends_in_byte_run(
    name: str, prompt: list[int], generated: list[int], skip: bool, model: ByteOracle | None = None
) -> bool:
    """Byte-fallback only: the prompt's trailing byte tokens and the first generated ones form one run. Then
    decode(prompt) resolved that run too early (one U+FFFD per byte, or valid text that later becomes U+FFFD), and
    the literal formula is wrong: the expected text comes from byte accounting (the oracle) instead."""
    model = oracle(name) if model is None else model
    if not model.byte_fallback:
        return False
    units = model.units(prompt, generated, skip)
    prompt_units = [u for u in units if not u.from_generated]
    generated_units = [u for u in units if u.from_generated]
    return bool(prompt_units and generated_units and prompt_units[-1].is_byte and generated_units[0].is_byte)


def check_stream(
    name: str,
    prompt: list[int],
    generated: list[int],
    skip: bool,
    path: str,
    *,
    per_step: bool = True,
    tokenizer=None,
    model: ByteOracle | None = None,
) -> str:
    """Stream `generated` after `prompt`; assert every rule; return the streamed text. `tokenizer`/`model` stand
    in for the fixture's tokenizer and oracle (another backend with the same ids reuses every check)."""
    tokenizer = load_fixture_tokenizer(name) if tokenizer is None else tokenizer
    model = oracle(name) if model is None else model
    stream = DecodeStream(tokenizer, prompt, skip, force_generic=path == "generic")
    assert stream.fast_path == (path == "fast")
    boundary_run = prompt_ends_in_byte_run(name, prompt, generated, skip, model)
    emitted = ""
    for k, token_id in enumerate(generated):
        piece = stream.step(token_id)
        assert piece is None or (isinstance(piece, str) and piece), "step returns None or a non-empty string"
        emitted += piece or ""
        if not per_step or (path == "generic" and boundary_run):
            continue
        final_so_far = model.expected_final_so_far(prompt, generated[: k + 1], skip)
        if path == "fast":
            assert emitted == final_so_far, f"after id #{k} ({token_id})"
        else:
            # The generic algorithm sees only text: it may also withhold a trailing run of U+FFFD.
            assert final_so_far.startswith(emitted), f"after id #{k} ({token_id})"
            assert set(final_so_far[len(emitted) :]) <= {REPLACEMENT}, f"late text after id #{k} ({token_id})"
    flushed = stream.flush()
    assert flushed is None or flushed
    total = emitted + (flushed or "")
    expected = model.expected(prompt, generated, skip)
    if boundary_run and path == "generic":
        # A generic decoder sees no bytes, so it can only follow the literal formula here (see generic.py).
        assert total == literal_expected(tokenizer, prompt, generated, skip)
    else:
        assert total == expected
    if not boundary_run:
        assert expected == literal_expected(tokenizer, prompt, generated, skip)
    return total


def cut_points_inside_characters(name: str, ids: list[int]) -> list[int]:
    """Prefix lengths at which the prompt ends inside a character (or inside a byte-token run)."""
    model = oracle(name)
    cuts = []
    for cut in range(1, len(ids)):
        units = model.units(ids[:cut], [], False)
        data = b"".join(u.data for u in units)
        if model.pending_units(units) or incomplete_tail_length(data):
            cuts.append(cut)
    return cuts
