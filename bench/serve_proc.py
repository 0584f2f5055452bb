"""`detok serve` as a benchmark's child process: started on a free port, its URL read from its output, stopped with
SIGTERM when the block ends (bench_http, http_per_chunk, bench_load)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from common import REPO

URL_LINE = re.compile(r"serving at (http://\S+)")


@contextlib.contextmanager
def detok_serve(*args: str, timeout_s: float = 90.0) -> Iterator[str]:
    """Run `detok serve --port 0 ARGS` until the block ends; yields its URL."""
    argv = [sys.executable, "-m", "detok_worker.cli", "serve", "--port", "0", "--log-level", "WARNING", *args]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            yield wait_for_url(proc, log, timeout_s)
        finally:
            stop_child(proc, signal.SIGTERM, 20.0)


def stop_child(proc: subprocess.Popen[str], sig: int, timeout_s: float) -> None:
    """Send `sig` to a child still running; kill it if it has not exited within timeout_s."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_url(proc: subprocess.Popen[str], log: Any, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        match = URL_LINE.search(line)
        if match:
            return match.group(1)
    log.seek(0)
    raise RuntimeError(f"detok serve did not start: {log.read().decode(errors='replace')[-3000:]}")
