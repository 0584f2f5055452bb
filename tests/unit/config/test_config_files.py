"""configs/*.toml against detok_worker/config/schema.py, and the effective-config TOML round trip."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import msgspec
import pytest
from helpers.fixtures import REPO

from detok_worker.config import ConfigError, DetokConfig, WorkerConfig, config_to_toml, load_config, validate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIGS = REPO / "configs"


def _leaf_keys(tree: dict, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        keys |= _leaf_keys(value, dotted + ".") if isinstance(value, dict) else {dotted}
    return keys


def test_default_toml_equals_the_struct_defaults() -> None:
    assert load_config(CONFIGS / "default.toml") == DetokConfig()


def test_default_toml_lists_every_option() -> None:
    in_file = _leaf_keys(tomllib.loads((CONFIGS / "default.toml").read_text()))
    in_structs = _leaf_keys(msgspec.to_builtins(DetokConfig()))
    assert in_file == in_structs


def test_every_option_in_default_toml_has_a_comment() -> None:
    lines = (CONFIGS / "default.toml").read_text().splitlines()
    undocumented = []
    for index, line in enumerate(lines):
        match = re.match(r"^([a-z0-9_]+)\s*=", line)
        if not match:
            continue
        # documented by the comment block right above it, or by the nearest option above in the same block
        above = index - 1
        while above >= 0 and re.match(r"^[a-z0-9_]+\s*=", lines[above]):
            above -= 1
        if above < 0 or not lines[above].startswith("#"):
            undocumented.append(match.group(1))
    assert undocumented == []


def test_default_config_uses_the_embedded_tokenizer_and_two_workers() -> None:
    config = load_config(CONFIGS / "default.toml")
    assert config.tokenizer.path == ""
    assert config.worker.count == 2


@pytest.mark.parametrize("name", ["multihost.toml", "bench.toml"])
def test_shipped_configs_load(name: str) -> None:
    assert isinstance(load_config(CONFIGS / name), DetokConfig)


def test_multihost_config_uses_tcp_with_curve_keys() -> None:
    bus = load_config(CONFIGS / "multihost.toml").bus
    endpoints = (bus.engine_endpoint, bus.worker_endpoint, bus.front_endpoint)
    assert all(endpoint.startswith("tcp://") for endpoint in endpoints)
    assert len(set(endpoints)) == 3
    assert bus.curve_server_public_key and bus.curve_server_secret_key
    assert bus.allow_insecure_tcp is False


def test_bench_config_steps_flat_out() -> None:
    config = load_config(CONFIGS / "bench.toml")
    assert config.engine.step_interval_ms == 0
    assert config.worker.count > DetokConfig().worker.count


def test_effective_config_toml_round_trips(tmp_path: Path) -> None:
    config = load_config(
        None,
        {
            "front.model_name": 'quote " backslash \\ tab \t newline \n emoji \U0001f600 ctl \x01',
            "front.port": 0,
            "engine.step_interval_ms": 0.125,
            "engine.replay_speed": 1e-7,
            "tokenizer.cache.enable_l1": True,
            "worker.count": 7,
        },
    )
    path = tmp_path / "effective.toml"
    path.write_text(config_to_toml(config), encoding="utf-8")
    assert load_config(path) == config


def test_invalid_value_names_the_key() -> None:
    with pytest.raises(ConfigError, match="worker.count"):
        load_config(None, {"worker.count": 0})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"front.port": 70000}, "front.port = 70000: expected `int` <= 65535"),
        ({"engine.connect_timeout_s": 0}, "engine.connect_timeout_s = 0: expected `float` > 0.0"),
        ({"engine.source": "x"}, "engine.source = 'x': must be one of corpus, echo, trace, llama-cpp, grpc, vllm"),
        ({"engine.engine_service": "x"}, "engine.engine_service = 'x': must be one of auto, vllm, sglang"),
        ({"logging.format": "xml"}, "logging.format = 'xml': must be one of human, json"),
        ({"front.nope": 1}, "front: object contains unknown field `nope`"),
        ({"front.max_tokens_limit": 1}, "front.max_tokens_limit = 1 is below front.max_tokens_default = 256"),
    ],
)
def test_a_bad_value_is_named_with_what_it_must_be(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"engine.source": "vllm", "engine.model": "m", "engine.max_batch": 64},
            "engine.max_batch = 64 needs engine.source = corpus or echo or trace or llama-cpp, not vllm",
        ),
        (
            {"engine.source": "grpc", "engine.engine_url": "grpc://h:1", "engine.step_interval_ms": 5.0},
            "engine.step_interval_ms = 5.0 needs engine.source = corpus or echo or trace or llama-cpp, not grpc",
        ),
        (
            {"engine.engine_url": "grpc://h:1"},
            "engine.engine_url = 'grpc://h:1' needs engine.source = grpc, not corpus",
        ),
        ({"engine.source": "echo", "engine.seed": 3}, "engine.seed = 3 needs engine.source = corpus, not echo"),
        (
            {"engine.vllm_args": ["--max-model-len", "8"]},
            "engine.vllm_args = ['--max-model-len', '8'] needs engine.source = vllm, not corpus",
        ),
        (
            {"engine.source": "vllm", "engine.model": "m", "engine.model_threads": 2},
            "engine.model_threads = 2 needs engine.source = llama-cpp, not vllm",
        ),
        (
            {"front.prompt_tokens_details": True},
            "front.prompt_tokens_details = True needs engine.source = vllm, not corpus",
        ),
    ],
)
def test_an_option_of_another_engine_source_is_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "overrides",
    [
        {"engine.source": "grpc", "engine.engine_url": "grpc://h:1", "engine.start_retries": 0},
        {"engine.source": "vllm", "engine.model": "m", "engine.vllm_args": ["--max-model-len", "8"]},
        {"engine.source": "llama-cpp", "engine.model": "m.gguf", "engine.model_threads": 2, "engine.max_batch": 4},
        {"engine.source": "echo", "engine.step_interval_ms": 0.0, "engine.tokens_per_step": 4},
        {"engine.source": "trace", "engine.trace": "t.jsonl", "engine.replay_speed": 0.0},
        {"engine.source": "corpus", "engine.corpus": "texts", "engine.seed": 9},
        # another source's option at its default (as configs/default.toml writes it) is not a choice
        {"engine.source": "vllm", "engine.model": "m", "engine.max_batch": 256, "engine.engine_url": ""},
    ],
)
def test_an_option_of_its_own_engine_source_is_taken(overrides: dict) -> None:
    engine = load_config(None, overrides).engine
    for key, value in overrides.items():
        assert getattr(engine, key.removeprefix("engine.")) == value, key


def test_logging_level_in_any_case() -> None:
    assert load_config(None, {"logging.level": "debug"}).logging.level == "DEBUG"


def test_validate_checks_a_config_built_in_code() -> None:
    with pytest.raises(ConfigError, match="worker.count = 0"):
        validate(msgspec.structs.replace(DetokConfig(), worker=WorkerConfig(count=0)))
