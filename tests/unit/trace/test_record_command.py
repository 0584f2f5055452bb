"""`detok trace record` is `detok serve` with the engine recording: it takes the same `--` engine flags and
prepares its config the same way (on --source vllm the vLLM flags applied once, the API key source checked) before
the supervisor starts; a flag that guards the server must not be dropped because the service was started to
record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from detok_worker.cli import service
from detok_worker.cli.main import main
from detok_worker.config import DetokConfig


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What the vLLM flags step saw and what the supervisor was given (neither runs for real)."""
    seen: dict[str, Any] = {}

    def apply_flags(config: DetokConfig, *, needs_vllm: bool = True) -> DetokConfig:
        seen["vllm_args"] = list(config.engine.vllm_args)
        return msgspec.structs.replace(config, front=msgspec.structs.replace(config.front, api_keys=["from-flags"]))

    def serve(config: DetokConfig, startup_timeout_s: float) -> int:
        seen["config"] = config
        return 0

    monkeypatch.setattr(service, "with_vllm_flags", apply_flags)
    monkeypatch.setattr("detok_worker.process.supervisor.serve", serve)
    return seen


@pytest.mark.parametrize("command", [["serve"], ["trace", "record", "-o", "out.trace"]])
def test_serve_and_record_apply_the_vllm_flags_before_the_supervisor(
    started: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--source", "vllm", "--model", "m", "--", "--api-key", "k"]) == 0
    assert started["vllm_args"] == ["--api-key", "k"]
    config = started["config"]
    assert config.front.api_keys == ["from-flags"]  # the supervisor runs what the flags made of the config
    assert config.engine.record == (str(tmp_path / "out.trace") if command[0] == "trace" else "")
