"""Test harness for `detok engine-server` (engine_stub's sources as a gRPC VllmEngine): start it as a subprocess,
read its address, its counts (stats file), kill and restart it on the same port."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers.serve_helpers import REPO

LISTEN_LINE = re.compile(r"engine server listening on (grpc://\S+)")


class EngineServer:
    def __init__(self, *args: str, port: int = 0, startup_timeout: float = 60.0) -> None:
        self.args = args
        self.workdir = Path(tempfile.mkdtemp(prefix="detok-test-engine-"))
        self.stats_path = self.workdir / "stats.json"
        self.log_path = self.workdir / "engine.log"
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.start(startup_timeout)

    def start(self, timeout: float = 60.0) -> None:
        argv = [
            sys.executable, "-m", "detok_worker.cli", "engine-server", "--listen", f"127.0.0.1:{self.port}",
            "--stats-file", str(self.stats_path), *self.args,
        ]  # fmt: skip
        with open(self.log_path, "a") as log:
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            match = LISTEN_LINE.search(line)
            if match:
                self.url = match.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                return
        self.kill()
        raise AssertionError(f"engine server did not start; log:\n{self.log_path.read_text()[-4000:]}")

    def stats(self) -> dict[str, Any]:
        try:
            return json.loads(self.stats_path.read_text())
        except (OSError, ValueError):
            return {}

    def count(self, name: str) -> int:
        return int(self.stats().get(name, 0))

    def kill(self) -> None:
        """SIGKILL: the engine crashes (no goodbye to its clients)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        with contextlib.suppress(OSError):
            if self.proc is not None and self.proc.stdout is not None:
                self.proc.stdout.close()

    def cleanup(self) -> None:
        self.stop()
        for file in self.workdir.iterdir():
            file.unlink()
        self.workdir.rmdir()


@contextlib.contextmanager
def engine_server(*args: str) -> Iterator[EngineServer]:
    """An EngineServer with `args`, cleaned up however the block ends."""
    server = EngineServer(*args)
    try:
        yield server
    finally:
        server.cleanup()
