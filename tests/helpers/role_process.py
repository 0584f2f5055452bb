"""One detok role (`python -m detok_worker.cli ROLE ...`) as its own process with its log in a file: the
Procfile way of running detok, process by process, in one runtime dir."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from helpers.serve_helpers import REPO


class RoleProcess:
    """`python -m detok_worker.cli ROLE ...` with its log in a file."""

    def __init__(
        self,
        runtime_dir: str,
        role: str,
        *args: str,
        log_name: str | None = None,
        env: dict[str, str] | None = None,
        soft_nofile: int | None = None,
        launcher: Sequence[str] = (),
    ) -> None:
        """`soft_nofile`: start the process with this soft open-file limit (the hard limit unchanged);
        `launcher`: a command that runs it (e.g. `ip netns exec NS`, which execs, so the pid stays the role's)."""
        self.log_path = Path(runtime_dir) / f"{log_name or role}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        command = [*launcher, sys.executable, "-m", "detok_worker.cli", role, "--runtime-dir", runtime_dir, *args]

        def limit_files() -> None:
            if soft_nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft_nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        self.proc = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=limit_files,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@contextmanager
def stopping(processes: dict[str, RoleProcess]) -> Iterator[dict[str, RoleProcess]]:
    """Stop every process in `processes` however the block ends: the ones in it then (a test may replace one)."""
    try:
        yield processes
    finally:
        for process in processes.values():
            process.stop()
