"""The processes of bench_gateway.py: the tokenizer directory every system loads, the gRPC engine server, SMG and
`detok serve` started and stopped, each process's CPU seconds from /proc, and a py-spy profile of one of them."""

from __future__ import annotations

import collections
import contextlib
import json
import lzma
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from common import QWEN3_DIR, REPO

# A neutral served model name: SMG picks a reasoning parser by itself when the name looks like qwen3, and detok's
# front has none, so both then do the same string work on /v1/chat/completions.
MODEL = "bench-model"
GRPC_URL = re.compile(r"engine server listening on (grpc://\S+)")
HTTP_URL = re.compile(r"serving at (http://\S+)")


def write_tokenizer_dir(root: Path) -> Path:
    """A plain directory with the Qwen3 tokenizer.json, tokenizer_config.json and a config.json: SMG takes a
    --tokenizer-path without config.json for a hub repo name (and goes to the network)."""
    directory = root / "bench-tokenizer"
    directory.mkdir()
    with lzma.open(QWEN3_DIR / "tokenizer.json.xz") as packed, open(directory / "tokenizer.json", "wb") as plain:
        shutil.copyfileobj(packed, plain)
    shutil.copy(QWEN3_DIR / "tokenizer_config.json", directory)
    vocab = json.loads((directory / "tokenizer.json").read_text())
    size = len(vocab["model"]["vocab"]) + len(vocab["added_tokens"])
    eos = next(token["id"] for token in vocab["added_tokens"] if token["content"] == "<|im_end|>")
    (directory / "config.json").write_text(json.dumps({"vocab_size": size, "eos_token_id": eos}))
    return directory


def child_pids(parent: int) -> list[int]:
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    children.append(int(entry.name))
    return children


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Service:
    """A started process: stdout and stderr go to a log file, read for its address."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_path
        with open(log_path, "wb") as log:
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_for_line(self, pattern: re.Pattern[str], timeout_s: float = 90.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            match = pattern.search(self.log_path.read_text(errors="replace"))
            if match:
                return match.group(1)
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start:\n{self.log_tail()}")

    def processes(self) -> dict[str, int]:
        """role -> pid of the process and its children (detok serve's are named by their subcommand)."""
        found = {self.name: self.pid}
        for pid in child_pids(self.pid):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
                role = argv[3] if len(argv) > 3 and argv[2] == "detok_worker.cli" else f"child {pid}"
                key = f"{role} {argv[argv.index('--id') + 1]}" if "--id" in argv else role
                found[key if key not in found else f"{key} {pid}"] = pid  # several fronts: one key each
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def detok_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "detok_worker.cli", *args]


def start_engine_server(tokenizer_dir: Path, workdir: Path, step_ms: float = 0.0) -> tuple[Service, str]:
    """`detok engine-server` on the corpus source, one id per chunk every `step_ms` (0: flat out), logging each
    request's ids; returns it and its URL."""
    argv = detok_argv(
        "engine-server", "--listen", "127.0.0.1:0", "--source", "corpus", "--step-interval-ms", str(step_ms),
        "--tokenizer", str(tokenizer_dir), "--set", f'front.model_name="{MODEL}"', "--log-level", "WARNING",
        "--requests-log", str(workdir / "requests.jsonl"),
    )  # fmt: skip
    service = Service("engine-server", argv, workdir / "engine-server.log")
    return service, service.wait_for_line(GRPC_URL)


def start_smg(engine_url: str, tokenizer_dir: Path, workdir: Path) -> tuple[Service, str]:
    """Without its circuit breaker: a few failed stream starts under a burst of 1500 would otherwise open it and
    turn every request of the next ~60 s into a 503."""
    port = free_port()
    argv = [
        shutil.which("smg") or "smg", "launch", "--worker-urls", engine_url, "--tokenizer-path", str(tokenizer_dir),
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()), "--log-level", "warn",
        "--disable-circuit-breaker",
    ]  # fmt: skip
    service = Service("smg", argv, workdir / "smg.log", env={"HF_HUB_OFFLINE": "1"})
    return service, f"http://127.0.0.1:{port}"


def start_detok(engine_url: str, tokenizer_dir: Path, workdir: Path, workers: int) -> tuple[Service, str]:
    argv = detok_argv(
        "serve", "--port", "0", "--workers", str(workers), "--source", "grpc", "--engine-url", engine_url,
        "--tokenizer", str(tokenizer_dir),
        "--set", f'front.model_name="{MODEL}"', "--log-level", "WARNING",
    )  # fmt: skip
    service = Service("serve", argv, workdir / f"detok-{workers}.log")
    return service, service.wait_for_line(HTTP_URL)


def wait_until_serving(service: Service, url: str, timeout_s: float = 90.0) -> None:
    """Until a one-token chat completion succeeds (SMG answers /v1/models before its tokenizer is registered)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and service.proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{service.name} at {url} never served a chat completion:\n{service.log_tail()}")


@contextlib.contextmanager
def running(service: Service) -> Iterator[Service]:
    try:
        yield service
    finally:
        service.stop()


def start_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    """py-spy record of `pid` (collapsed stacks) for `seconds`, in the background."""
    argv = ["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200"]
    argv += ["--format", "raw", "--nonblocking", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def profile_summary(collapsed: Path, top: int = 15, package: str = "detok_worker/front/") -> list[str]:
    """Top frames of a py-spy raw profile: by self samples (the leaf frame) and by inclusive samples (the frames of
    `package`, our code in the profiled process)."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        samples = int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            if package in frame and "server.py" not in frame:
                inclusive[frame] += samples
    lines = [f"{total} samples; self (leaf frame):"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines.append(f"inclusive ({package.rstrip('/')} frames):")
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return lines
