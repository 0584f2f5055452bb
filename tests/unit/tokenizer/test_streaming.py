"""Streaming through the core is exact for every backend: the differential checks of test_decode_stream.py
(differential/check.py and its byte-accounting oracle), run on tokenizers loaded by the other backends.

Backends whose ids coincide with a fixture's reuse that fixture's oracle: o200k_base and o200k_harmony = gpt-oss,
cl100k_base = gpt35turbo, a Qwen-style
rank file and a GGUF rebuilt from qwen3 = qwen3, SentencePiece v1 (from the .model or from GGUF) = mistral-sp-v1
(SentencePiece's own byte semantics: differential/families.py, one U+FFFD per invalid byte). Tekken and the mock
get an oracle built from per-token bytes taken from an independent source (mistral-common; the mock's vocabulary);
Tekken's models mistral-common's IGNORE policy (a skipped special token still ends the text before it).
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from functools import cache
from pathlib import Path

import mistral_common
import pytest
from differential.check import check_stream, cut_points_inside_characters, oracle
from differential.families import sentencepiece_oracle
from differential.oracle import ByteOracle, Unit
from helpers.texts import load_texts, text_lines
from helpers.tokenizer_files import gguf_from_byte_level_fixture, gguf_from_sentencepiece, o200k_rank_file_bytes

from detok_worker.stream import DecodeStream
from detok_worker.tokenizer import create_tokenizer
from detok_worker.tokenizer.backends.mock import DEFAULT_SPECIALS, DEFAULT_WORDS, MockTokenizer
from detok_worker.tokenizer.backends.tiktoken import load_named_encoding, tiktoken_cache_file

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
FAST_PATH_AVAILABLE = importlib.util.find_spec("detok_worker.stream.decode.verify") is not None


class _TextEnd(Unit):
    """A skipped special token that still ends the text before it (mistral-common's IGNORE policy)."""


class IgnorePolicyOracle(ByteOracle):
    """The byte-level oracle for Tekken: with skip_special_tokens, each run between special tokens is decoded on
    its own (a skipped special token ends the text before it)."""

    def units(self, prompt: list[int], generated: list[int], skip: bool) -> list[Unit]:
        if not skip:
            return super().units(prompt, generated, skip)
        return [
            _TextEnd(b"", False, from_generated)
            if token_id in self.special
            else Unit(self._data[token_id], False, from_generated)
            for from_generated, ids in ((False, prompt), (True, generated))
            for token_id in ids
        ]

    def chars(self, units: list[Unit]) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        segment: list[Unit] = []
        for unit in units:
            if isinstance(unit, _TextEnd):
                out += super().chars(segment)
                segment = []
            else:
                segment.append(unit)
        return out + super().chars(segment)

    def changeable_chars(self, units: list[Unit]) -> int:
        last_end = max((k for k, unit in enumerate(units) if isinstance(unit, _TextEnd)), default=-1)
        return super().changeable_chars(units[last_end + 1 :])


def _o200k(tmp: Path):
    import os

    os.environ["TIKTOKEN_CACHE_DIR"] = str(tmp)  # only read while loading; restored by the fixture below
    tiktoken_cache_file("o200k_base").write_bytes(o200k_rank_file_bytes())
    return load_named_encoding("o200k_base")


def _qwen_rank_file(tmp: Path):
    import json

    from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
    from helpers.tokenizer_files import byte_level_ranks, rank_file_bytes

    (tmp / "qwen.tiktoken").write_bytes(rank_file_bytes(byte_level_ranks("qwen3", 151643)))
    config = json.loads((FIXTURE_TOKENIZER_DIRS["qwen3"] / "tokenizer_config.json").read_text())
    (tmp / "tokenizer_config.json").write_text(json.dumps({**config, "pat_str": "qwen"}))
    return create_tokenizer(tmp / "qwen.tiktoken")


def _tekken_oracle(tokenizer) -> ByteOracle:
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    reference = Tekkenizer.from_file(tokenizer.name)
    pieces = [reference.id_to_byte_piece(i, SpecialTokenPolicy.KEEP) for i in range(reference.n_words)]
    return IgnorePolicyOracle.from_pieces(pieces, frozenset(range(reference.num_special_tokens)))


def _named_tiktoken(encoding: str) -> Callable:
    def build(tmp: Path):
        import os
        import shutil

        from helpers.tokenizer_files import cl100k_rank_file

        os.environ["TIKTOKEN_CACHE_DIR"] = str(tmp)  # only read while loading; restored by loaded()
        tiktoken_cache_file("o200k_base").write_bytes(o200k_rank_file_bytes())
        shutil.copy(cl100k_rank_file(), tiktoken_cache_file("cl100k_base"))
        return load_named_encoding(encoding)

    return build


def _mock_oracle(tokenizer) -> ByteOracle:
    pieces = (
        [bytes([b]) for b in range(256)] + [w.encode() for w in DEFAULT_WORDS] + [s.encode() for s in DEFAULT_SPECIALS]
    )
    return ByteOracle.from_pieces(pieces, frozenset(range(256 + len(DEFAULT_WORDS), len(pieces))))


def _transformers_qwen3(tmp: Path):
    import shutil

    from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
    from helpers.tokenizer_files import fixture_tokenizer_json
    from transformers import AutoTokenizer

    from detok_worker.tokenizer.backends.python import wrap_python_tokenizer

    (tmp / "tokenizer.json").write_text(fixture_tokenizer_json("qwen3"))
    shutil.copy(FIXTURE_TOKENIZER_DIRS["qwen3"] / "tokenizer_config.json", tmp / "tokenizer_config.json")
    return wrap_python_tokenizer(AutoTokenizer.from_pretrained(str(tmp)), name="qwen3-transformers")


# case -> (fixture whose oracle applies or None, builder(tmp dir), oracle builder or None, byte-level?)
CASES: dict[str, tuple[str | None, Callable, Callable | None, bool]] = {
    "tiktoken-o200k": ("gpt-oss", _o200k, None, True),
    "tiktoken-qwen-rank-file": ("qwen3", _qwen_rank_file, None, True),
    "gguf-qwen3": (
        "qwen3",
        lambda tmp: create_tokenizer(gguf_from_byte_level_fixture("qwen3", tmp / "q.gguf")),
        None,
        True,
    ),
    "sentencepiece-v1": (
        "mistral-sp-v1",
        lambda tmp: create_tokenizer(MISTRAL_DATA / "tokenizer.model.v1"),
        sentencepiece_oracle,
        False,
    ),
    "gguf-sentencepiece-v1": (
        "mistral-sp-v1",
        lambda tmp: create_tokenizer(gguf_from_sentencepiece(MISTRAL_DATA / "tokenizer.model.v1", tmp / "s.gguf")),
        sentencepiece_oracle,
        False,
    ),
    "tiktoken-cl100k": ("gpt35turbo", _named_tiktoken("cl100k_base"), None, True),
    "tiktoken-o200k-harmony": ("gpt-oss", _named_tiktoken("o200k_harmony"), None, True),
    "tekken": (None, lambda tmp: create_tokenizer(MISTRAL_DATA / "tekken_240911.json"), _tekken_oracle, True),
    "tekken-240718": (None, lambda tmp: create_tokenizer(MISTRAL_DATA / "tekken_240718.json"), _tekken_oracle, True),
    "mock": (None, lambda tmp: MockTokenizer(), _mock_oracle, True),
    "transformers-qwen3": ("qwen3", _transformers_qwen3, None, True),
}


@cache
def loaded(case: str):
    """(oracle fixture name, tokenizer, oracle) for a case, built once per session."""
    import os
    import tempfile

    fixture, build, build_oracle, _ = CASES[case]
    saved = os.environ.get("TIKTOKEN_CACHE_DIR")
    try:
        tokenizer = build(Path(tempfile.mkdtemp(prefix=f"detok-{case}-")))
    finally:
        if saved is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = saved
    model = build_oracle(tokenizer) if build_oracle else None
    return fixture or "qwen3", tokenizer, model


def paths_for(case: str) -> list[str]:
    return ["generic", "fast"] if CASES[case][3] else ["generic"]


PARAMS = [pytest.param(case, path, id=f"{case}-{path}") for case in CASES for path in paths_for(case)]


def _stream(case: str, prompt: list[int], generated: list[int], skip: bool, path: str, per_step: bool = True) -> str:
    if path == "fast" and not FAST_PATH_AVAILABLE:
        pytest.skip("the streaming core's fast path is not available yet")
    name, tokenizer, model = loaded(case)
    return check_stream(name, prompt, generated, skip, path, per_step=per_step, tokenizer=tokenizer, model=model)


@pytest.mark.parametrize(("case", "path"), PARAMS)
def test_whole_texts_stream_to_their_decode(case: str, path: str) -> None:
    _, tokenizer, _ = loaded(case)
    for number, text in enumerate(load_texts().values()):
        ids = tokenizer.encode(text, add_special_tokens=True).ids
        skip = number % 2 == 1
        assert _stream(case, [], ids, skip, path, per_step=False) == tokenizer.decode(ids, skip)


@pytest.mark.parametrize(("case", "path"), PARAMS)
def test_lines_with_prompts_and_special_tokens_have_no_late_characters(case: str, path: str) -> None:
    _, tokenizer, _ = loaded(case)
    special = sorted(tokenizer.special_token_ids)[:8]
    previous: list[int] = []
    for number, (_, line) in enumerate(text_lines()[::3]):
        ids = tokenizer.encode(line).ids
        generated = [*ids[:3], special[number % len(special)], *ids[3:]]
        _stream(case, previous[-8:], generated, number % 2 == 1, path)
        previous = ids


@pytest.mark.parametrize(("case", "path"), [p for p in PARAMS if CASES[p.values[0]][0] is not None])
def test_prompt_cut_inside_a_character_leaks_nothing(case: str, path: str) -> None:
    name, tokenizer, _ = loaded(case)
    text = load_texts()["emoji"]
    ids = tokenizer.encode(text).ids
    cuts = cut_points_inside_characters(name, ids, loaded(case)[2])[:10]
    assert cuts
    for cut in cuts:
        assert text.endswith(_stream(case, ids[:cut], ids[cut:], False, path))


@pytest.mark.parametrize(("case", "path"), [p for p in PARAMS if CASES[p.values[0]][3]])
def test_random_ids_with_partial_characters(case: str, path: str) -> None:
    """Byte-level backends: seeded random ids (many of them partial UTF-8), after random prompts."""
    _, tokenizer, model = loaded(case)
    rng = random.Random(case)
    model = model or _fixture_oracle(case)
    partial = [i for i in model.partial_ids if tokenizer.id_to_token(i) is not None]
    # o200k_harmony has 1069 reserved ids past the gpt-oss fixture (whose oracle it shares): draw ids both know
    known = [i for i in range(min(tokenizer.vocab_size, model.vocab_size)) if tokenizer.id_to_token(i) is not None]
    for _ in range(25):
        ids = [rng.choice(partial) if rng.random() < 0.5 else rng.choice(known) for _ in range(rng.randrange(1, 24))]
        cut = rng.randrange(0, len(ids))
        _stream(case, ids[:cut], ids[cut:], rng.random() < 0.5, path)


def _fixture_oracle(case: str) -> ByteOracle:
    return oracle(loaded(case)[0])


@pytest.mark.skipif(not FAST_PATH_AVAILABLE, reason="the streaming core's fast path is not available yet")
@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_is_used_exactly_where_it_applies(case: str) -> None:
    _, tokenizer, _ = loaded(case)
    assert DecodeStream(tokenizer).fast_path == CASES[case][3]


def test_three_token_emoji_is_emitted_at_its_third_token_on_tiktoken() -> None:
    _, tokenizer, _ = loaded("tiktoken-o200k")
    ids = tokenizer.encode("\U0001fae8").ids
    assert len(ids) == 3
    for force_generic in (True, False) if FAST_PATH_AVAILABLE else (True,):
        stream = DecodeStream(tokenizer, tokenizer.encode("Look: ").ids, force_generic=force_generic)
        assert [stream.step(i) for i in ids] == [None, None, "\U0001fae8"]
        assert stream.flush() is None
