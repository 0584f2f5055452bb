"""The llama-cpp token source built from the config: its plan is the model's greedy output (one id past max_tokens
so the scheduler can tell "length"; ending at a stop token id or end-of-generation id), and it refuses what it
cannot serve exactly: a tokenizer that is not the model's, a model file that does not load, a prompt that does not
fit the context."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.llama_oracle import greedy_ids, smollm2

from detok_worker.bus.messages import DetokParams, RequestParams
from detok_worker.config import ConfigError, load_config
from detok_worker.tokenizer import create_tokenizer
from engine_stub.llama_source import default_model_path
from engine_stub.sources import SourceError, create_source


@pytest.fixture(scope="module")
def tokenizer():
    return create_tokenizer(str(default_model_path()))


@pytest.fixture(scope="module")
def source(tokenizer):
    return create_source(load_config(overrides={"engine.source": "llama-cpp"}), tokenizer)


def _prompt(tokenizer, *turns: str) -> list[int]:
    messages = [{"role": "system", "content": "Answer in one line."}]
    messages += [{"role": ("user", "assistant")[number % 2], "content": turn} for number, turn in enumerate(turns)]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)).ids


def test_plan_is_the_greedy_output_one_past_max_tokens(source, tokenizer) -> None:
    assert source.name == "llama-cpp"
    prompt = _prompt(tokenizer, "Write a long story about a dragon.")
    plan = source.plan("r1", prompt, RequestParams(max_tokens=12))
    assert plan.ids == greedy_ids(prompt, 13)
    assert len(plan.ids) == 13 and plan.offsets_ns is None
    stop_id = plan.ids[4]
    stopped = source.plan("r2", prompt, RequestParams(max_tokens=12, detok=DetokParams(stop_token_ids=[stop_id])))
    assert stopped.ids == plan.ids[: plan.ids.index(stop_id) + 1]


def test_plan_ends_at_the_models_end_of_generation_unless_ignore_eos(source, tokenizer) -> None:
    prompt = _prompt(tokenizer, "What is 12 * 34?", "408.", "And 56 + 78?")
    plan = source.plan("r1", prompt, RequestParams(max_tokens=40))
    assert len(plan.ids) < 40 and plan.ids[-1] in smollm2().end_of_generation_ids
    ignoring = source.plan("r2", prompt, RequestParams(max_tokens=len(plan.ids) + 3, ignore_eos=True))
    assert ignoring.ids[: len(plan.ids)] == plan.ids and len(ignoring.ids) == len(plan.ids) + 4


def test_prompts_that_cannot_be_generated_from_are_errors(source) -> None:
    with pytest.raises(ValueError, match="exceed the model context"):
        source.plan("r1", [1, 2, 3], RequestParams(max_tokens=100_000))
    with pytest.raises(ValueError, match="non-empty prompt"):
        source.plan("r2", [], RequestParams(max_tokens=4))
    with pytest.raises(ValueError, match="outside the model vocabulary"):
        source.plan("r3", [1, 49_152], RequestParams(max_tokens=4))


def test_another_tokenizer_or_a_bad_model_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=f"serve with --tokenizer {default_model_path()}"):
        create_source(load_config(overrides={"engine.source": "llama-cpp"}), load_fixture_tokenizer("qwen3"))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(64))
    config = load_config(overrides={"engine.source": "llama-cpp", "engine.model": str(broken)})
    with pytest.raises(SourceError, match="cannot load model"):
        create_source(config, load_fixture_tokenizer("qwen3"))
    with pytest.raises(ConfigError, match="model_threads"):
        load_config(overrides={"engine.source": "llama-cpp", "engine.model_threads": 0})
