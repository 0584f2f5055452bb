"""Stream one case and hold it to every rule: per step no late character and nothing premature, exact in total."""

from __future__ import annotations

from functools import cache

from helpers.fixtures import load_fixture_tokenizer

from detok_worker.stream import DecodeStream
from detok_worker.stream.decode.byte_tokens import byte_tokens_for
from differential.oracle import ByteOracle

REPLACEMENT = "\ufffd"


@cache
def oracle(name: str) -> ByteOracle:
    """The oracle of a fixture tokenizer (from its tokenizer.json token strings)."""
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


def sees_bytes(stream: DecodeStream) -> bool:
    """Whether the stream knows bytes (fast path, or generic with raw-byte tokens): then it withholds exactly what
    can change; a generic stream that sees only text may also withhold a trailing run of U+FFFD."""
    return stream.fast_path or byte_tokens_for(stream.tokenizer) is not None


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
    in for the fixture's tokenizer and oracle (another backend with the same ids reuses every check). path:
    "fast" or "generic" (forced), or "auto" (whatever DecodeStream picks)."""
    tokenizer = load_fixture_tokenizer(name) if tokenizer is None else tokenizer
    model = oracle(name) if model is None else model
    stream = DecodeStream(tokenizer, prompt, skip, force_generic=path == "generic")
    if path != "auto":
        assert stream.fast_path == (path == "fast")
    exact = sees_bytes(stream)
    # A generic stream that sees only text can only follow the literal formula where a prompt's byte run continues.
    boundary_run = not exact and prompt_ends_in_byte_run(name, prompt, generated, skip, model)
    emitted = ""
    for k, token_id in enumerate(generated):
        piece = stream.step(token_id)
        assert piece is None or (isinstance(piece, str) and piece), "step returns None or a non-empty string"
        emitted += piece or ""
        if not per_step or boundary_run:
            continue
        final_so_far = model.expected_final_so_far(prompt, generated[: k + 1], skip)
        if exact:
            assert emitted == final_so_far, f"after id #{k} ({token_id})"
        else:
            assert final_so_far.startswith(emitted), f"after id #{k} ({token_id})"
            assert set(final_so_far[len(emitted) :]) <= {REPLACEMENT}, f"late text after id #{k} ({token_id})"
    flushed = stream.flush()
    assert flushed is None or flushed
    total = emitted + (flushed or "")
    expected = model.expected(prompt, generated, skip)
    if boundary_run:
        assert total == literal_expected(tokenizer, prompt, generated, skip)
    else:
        assert total == expected
    return total


def cut_points_inside_characters(name: str, ids: list[int], model: ByteOracle | None = None) -> list[int]:
    """Prefix lengths at which the prompt ends inside a character (or inside a byte-token run)."""
    model = oracle(name) if model is None else model
    cuts = []
    for cut in range(1, len(ids)):
        units = model.units(ids[:cut], [], False)
        if model.changeable_chars(units) or (model.byte_fallback and units and units[-1].is_byte):
            cuts.append(cut)
    return cuts
