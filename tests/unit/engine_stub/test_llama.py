"""The llama-cpp token source built from the config generates step by step: its ids are plain llama.cpp greedy
output (the oracle decodes the whole prompt at once; the source in chunks, one per engine step), interleaved
generations do not disturb each other (each has its own context), a stop id ends a generation, min_tokens takes
the next-best id instead of a stop id, and what it cannot serve exactly is refused before any work: a tokenizer
that is not the model's, a model file that does not load, a prompt that does not fit the context."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.llama_oracle import greedy_ids, smollm2

from detok_worker.config import ConfigError, load_config
from detok_worker.engine.sources.base import SourceError
from detok_worker.tokenizer import create_tokenizer
from engine_stub.generators import GeneratingSource, GeneratorEngine
from engine_stub.llama import PREFILL_CHUNK, default_model_path
from engine_stub.local import create_local_source


@pytest.fixture(scope="module")
def tokenizer():
    return create_tokenizer(str(default_model_path()))


@pytest.fixture(scope="module")
def source(tokenizer):
    return create_local_source(load_config(overrides={"engine.source": "llama-cpp"}), tokenizer)


def _prompt(tokenizer, *turns: str) -> list[int]:
    messages = [{"role": "system", "content": "Answer in one line."}]
    messages += [{"role": ("user", "assistant")[number % 2], "content": turn} for number, turn in enumerate(turns)]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)).ids


def _steps(source, prompt: list[int], max_tokens: int, stop_ids, min_tokens: int = 0) -> list[int | None]:
    return list(source.generate(prompt, max_tokens, sorted(stop_ids), min_tokens))


def test_generation_is_llama_cpp_greedy_output_one_id_per_step_after_a_chunked_prefill(source, tokenizer) -> None:
    assert source.name == "llama-cpp" and isinstance(source, GeneratingSource)
    assert source.eos_ids == smollm2().end_of_generation_ids
    prompt = _prompt(tokenizer, "Write a long story about a dragon.")
    steps = _steps(source, prompt, 12, source.eos_ids)
    prefill_steps = math.ceil(len(prompt) / PREFILL_CHUNK) - 1
    expected = greedy_ids(prompt, 12)
    assert steps[:prefill_steps] == [None] * prefill_steps
    assert steps[prefill_steps:] == expected and len(steps) == prefill_steps + 12
    stop_id = expected[4]
    stopped = [i for i in _steps(source, prompt, 12, {stop_id}) if i is not None]
    assert stopped == expected[: expected.index(stop_id) + 1]


def test_interleaved_generations_give_each_its_own_greedy_ids(source, tokenizer) -> None:
    prompts = {
        "dragon": _prompt(tokenizer, "Write a long story about a dragon."),
        "primes": _prompt(tokenizer, "Name three primes."),
        "sea": _prompt(tokenizer, "Describe the sea in one sentence."),
    }
    engine = GeneratorEngine(source.generate, tokens_per_step=1, max_running=2)
    for rid, prompt in prompts.items():
        engine.add(rid, prompt, 16, sorted(source.eos_ids))
    out: dict[str, list[int]] = {rid: [] for rid in prompts}
    interleaved = 0
    while engine.has_work():
        step = engine.step()
        interleaved += sum(1 for _, ids, _ in step if ids) > 1
        for rid, ids, _ in step:
            out[rid] += ids
    assert interleaved > 5
    assert out == {rid: greedy_ids(prompt, 16) for rid, prompt in prompts.items()}


def test_end_of_generation_ignore_eos_and_min_tokens(source, tokenizer) -> None:
    prompt = _prompt(tokenizer, "What is 12 * 34?", "408.", "And 56 + 78?")
    ended = [i for i in _steps(source, prompt, 40, source.eos_ids) if i is not None]
    assert ended == greedy_ids(prompt, 40) and len(ended) < 40 and ended[-1] in source.eos_ids
    ignoring = [i for i in _steps(source, prompt, len(ended) + 3, ()) if i is not None]
    assert ignoring[: len(ended)] == ended and len(ignoring) == len(ended) + 3
    # min_tokens: where greedy would end, the next-best id is taken instead; no stop id before min_tokens
    at_least = len(ended) + 5
    longer = [i for i in _steps(source, prompt, 40, source.eos_ids, at_least) if i is not None]
    assert longer[: len(ended) - 1] == ended[:-1]
    assert not source.eos_ids & set(longer[:at_least]) and len(longer) >= at_least


def test_prompts_that_cannot_be_generated_from_are_refused_before_any_work(source) -> None:
    with pytest.raises(ValueError, match="exceed the model context"):
        source.generate([1, 2, 3], 100_000, [], 0)
    with pytest.raises(ValueError, match="non-empty prompt"):
        source.generate([], 4, [], 0)
    with pytest.raises(ValueError, match="outside the model vocabulary"):
        source.generate([1, 49_152], 4, [], 0)


def test_another_tokenizer_or_a_bad_model_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=f"serve with --tokenizer {default_model_path()}"):
        create_local_source(load_config(overrides={"engine.source": "llama-cpp"}), load_fixture_tokenizer("qwen3"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    config = load_config(overrides={"engine.source": "llama-cpp", "engine.model": str(broken)})
    with pytest.raises(SourceError, match="cannot load model"):
        create_local_source(config, load_fixture_tokenizer("qwen3"))
    with pytest.raises(ConfigError, match="model_threads"):
        load_config(overrides={"engine.source": "llama-cpp", "engine.model_threads": 0})
