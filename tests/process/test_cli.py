"""The `detok` command line: flags -> config, errors -> exit codes, logging setup, parent watch."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers.fixtures import REPO

from detok_worker.cli.main import build_parser
from detok_worker.config import ConfigError, load_config
from detok_worker.config.flags import add_config_flags, add_engine_flags, config_from_args, overrides_from_args
from detok_worker.process.logs import RateLimiter, setup_logging, warn_rate_limited


def run_detok(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "detok_worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def test_config_command_prints_the_effective_config(tmp_path: Path) -> None:
    result = run_detok(
        "config", "--workers", "3", "--port", "0", "--source", "echo", "--step-interval-ms", "2.5",
        "--set", "engine.tokens_per_step=4", "--set", "front.model_name=my-model", "--log-format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    path = tmp_path / "effective.toml"
    path.write_text(result.stdout)
    config = load_config(path)
    assert config.worker.count == 3
    assert config.front.port == 0
    assert config.engine.source == "echo"
    assert config.engine.step_interval_ms == 2.5
    assert config.engine.tokens_per_step == 4
    assert config.front.model_name == "my-model"
    assert config.logging.format == "json"


def test_config_file_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("[worker]\ncount = 5\n[front]\nport = 9123\n")
    args = build_parser().parse_args(["serve", "--config", str(path), "--port", "9124"])
    config = config_from_args(args)
    assert (config.worker.count, config.front.port) == (5, 9124)


def test_named_flag_wins_over_set() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    add_engine_flags(parser)
    args = parser.parse_args(["--set", "engine.max_batch=3", "--max-batch", "7", "--set", "engine.seed=11"])
    assert overrides_from_args(args) == {"engine.max_batch": 7, "engine.seed": 11}


def test_set_value_types() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    args = parser.parse_args(
        ["--set", "front.api_key=plain words", "--set", "tokenizer.cache.enable_l0=true", "--set", "front.port=0"]
    )
    assert overrides_from_args(args) == {"front.api_key": "plain words", "tokenizer.cache.enable_l0": True,
                                         "front.port": 0}  # fmt: skip


def test_set_value_with_a_hash_is_a_string_not_a_number_and_a_comment() -> None:
    """A Z85 CURVE key can start with digits and hold '#': TOML alone would read it as a number."""
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    key = "1234#abcdefghijklmnopqrstuvwxyzABCDEFGHI"
    args = parser.parse_args(["--set", f"bus.curve_server_secret_key={key}", "--set", 'front.api_key="a#b"'])
    assert overrides_from_args(args) == {"bus.curve_server_secret_key": key, "front.api_key": "a#b"}


def test_set_without_equals_is_a_config_error() -> None:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        overrides_from_args(parser.parse_args(["--set", "engine.seed"]))


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["config", "--workers", "0"], "worker.count"),
        (["config", "--set", "engine.nonsense=1"], "nonsense"),
        (["config", "--set", "engine.max_batch=lots"], "max_batch"),
        (["config", "--config", "/nonexistent/detok.toml"], "/nonexistent/detok.toml"),
        (["config", "--log-level", "LOUD"], "logging.level"),
        (["serve", "--log-level", "loud", "--port", "0"], "logging.level"),
    ],
)
def test_bad_config_exits_2_naming_the_problem(args: list[str], names: str) -> None:
    result = run_detok(*args)
    assert result.returncode == 2
    assert names in result.stderr
    assert "Traceback" not in result.stderr


def test_python_dash_m_detok_worker_is_the_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "detok_worker", "--help"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0
    for command in ("serve", "worker", "front", "engine", "config"):
        assert command in result.stdout


def test_serve_on_a_busy_port_fails_fast_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
        result = run_detok("serve", "--port", str(port), env=env)
    assert result.returncode == 2
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing left behind


def test_json_log_lines_carry_role_and_pid() -> None:
    stream = io.StringIO()
    try:
        setup_logging("worker:w7", "INFO", "json", stream=stream)
        logging.getLogger("detok.test").info("hello %s", "there")
        logging.getLogger("detok.test").debug("not shown at INFO")
    finally:
        setup_logging("pytest", "WARNING", "human", stream=sys.stderr)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert len(records) == 1
    assert records[0]["msg"] == "hello there"
    assert records[0]["role"] == "worker:w7"
    assert records[0]["pid"] == os.getpid()
    assert records[0]["level"] == "INFO"


def test_human_log_lines_carry_role_and_pid() -> None:
    stream = io.StringIO()
    try:
        setup_logging("front", "INFO", "human", stream=stream)
        logging.getLogger("detok.test").warning("careful")
    finally:
        setup_logging("pytest", "WARNING", "human", stream=sys.stderr)
    line = stream.getvalue().strip()
    assert f"front[{os.getpid()}]" in line and line.endswith("careful") and "WARNING" in line


def test_rate_limiter_suppresses_repeats_and_counts_them() -> None:
    limiter = RateLimiter(interval_s=3600)
    assert limiter.allow("bad frame") == 0
    assert [limiter.allow("bad frame") for _ in range(5)] == [None] * 5
    assert limiter.allow("other kind") == 0
    always = RateLimiter(interval_s=0)
    always.allow("k")
    always.allow("k")
    assert always.allow("k") == 0


def test_rate_limited_warning_logs_once_per_interval() -> None:
    stream = io.StringIO()
    limiter = RateLimiter(interval_s=3600)
    try:
        setup_logging("engine", "INFO", "json", stream=stream)
        for index in range(100):
            warn_rate_limited(logging.getLogger("detok.test"), limiter, "bad", "bad frame #%d", index)
    finally:
        setup_logging("pytest", "WARNING", "human", stream=sys.stderr)
    assert [json.loads(line)["msg"] for line in stream.getvalue().splitlines()] == ["bad frame #0"]


def test_rate_limiter_memory_is_bounded() -> None:
    limiter = RateLimiter(interval_s=3600, max_keys=10)
    for index in range(1000):
        limiter.allow(f"key {index}")
    assert len(limiter._last) <= 10


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie counts as gone
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_child_dies_when_its_supervisor_is_sigkilled() -> None:
    grandchild = textwrap.dedent(
        """
        import signal, sys, time
        from detok_worker.process.runtime import watch_parent
        assert watch_parent() is not None
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    parent = textwrap.dedent(
        f"""
        import os, subprocess, sys
        env = dict(os.environ, DETOK_PARENT_PID=str(os.getpid()))
        child = subprocess.Popen([sys.executable, "-c", {grandchild!r}], env=env, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        print(child.pid, flush=True)
        import time; time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        grandchild_pid = int(proc.stdout.readline())
        assert _alive(grandchild_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(grandchild_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild_pid)
    finally:
        proc.kill()
        proc.wait()


def test_the_flags_after_a_double_dash_are_vllms_engine_flags(tmp_path: Path) -> None:
    result = run_detok(
        "config", "--source", "vllm", "--model", "/models/qwen3", "--workers", "3",
        "--", "--max-model-len", "4096", "--served-model-name", "qwen3", "--workers", "9",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    path = tmp_path / "effective.toml"
    path.write_text(result.stdout)
    config = load_config(path)
    assert config.engine.vllm_args == ["--max-model-len", "4096", "--served-model-name", "qwen3", "--workers", "9"]
    assert config.worker.count == 3  # detok's own flag, before the --
    assert config.engine.model == "/models/qwen3"
    assert config.tokenizer.path == "/models/qwen3"  # the model's own tokenizer by default


def test_the_vllm_source_needs_a_model_and_only_engine_commands_take_engine_flags() -> None:
    result = run_detok("config", "--source", "vllm")
    assert result.returncode == 2 and "engine.source = vllm needs engine.model" in result.stderr
    result = run_detok("worker", "--", "--max-model-len", "4096")
    assert result.returncode == 2 and "takes no engine flags" in result.stderr
    explicit = run_detok("config", "--source", "vllm", "--model", "m", "--tokenizer", "/tok", "--", "--x")
    assert explicit.returncode == 0 and 'path = "/tok"' in explicit.stdout


def test_the_vllm_source_without_vllm_installed_says_so() -> None:
    """This environment has no vLLM (it lives in its own virtualenv): serve stops at once naming it; config shows
    the flags unapplied, with a warning."""
    serve = run_detok("serve", "--source", "vllm", "--model", "m", "--port", "0", "--", "--api-key", "k")
    assert serve.returncode == 1 and "--source vllm needs vLLM installed" in serve.stderr
    config = run_detok("config", "--source", "vllm", "--model", "m", "--", "--api-key", "k")
    assert config.returncode == 0 and "not applied" in config.stderr
