"""A supervised child process slot of `detok serve` and how its process is started: `python -m detok_worker.cli
<role> --config <runtime_dir>/config.toml` (workers with a host-derived id, stable across restarts)."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    """One supervised process slot (the process in it changes on restart)."""

    name: str
    role: str  # engine | front | worker
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures_in_row: int = 0
    restart_at: float | None = None
    retire_deadline: float | None = None  # set while a scaled-down worker is leaving
    pids: list[int] = field(default_factory=list)  # every pid this slot has had

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None


def child_argv(role: str, config_path: Path, worker_id: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "detok_worker.cli", role, "--config", str(config_path)]
    if worker_id is not None:
        argv += ["--id", worker_id]
    return argv


def worker_id(slot: int) -> str:
    return f"{socket.gethostname().split('.')[0] or 'host'}-w{slot}"
