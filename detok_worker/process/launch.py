"""What `detok serve` checks and prepares before it starts any process: the front's listen port (a clear error
if it is taken; port 0 becomes a concrete free port so the URL can be printed), and the private runtime dir
(a fresh mkdtemp per run, 0700), including sweeping dirs left behind by a supervisor that was SIGKILLed."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

from detok_worker.errors import OperatorError

RUNTIME_DIR_PREFIX = "detok-serve-"
PID_FILE = "supervisor.pid"

log = logging.getLogger(__name__)


class LaunchError(OperatorError):
    """`detok serve` cannot start (the message says why, for the operator)."""


class PortInUseError(LaunchError):
    pass


def default_runtime_base() -> Path:
    return Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())


def sweep_stale_runtime_dirs(base: Path) -> list[Path]:
    """Remove runtime dirs of ours whose supervisor is gone (it was SIGKILLed and could not clean up)."""
    removed: list[Path] = []
    for path in base.glob(RUNTIME_DIR_PREFIX + "*"):
        try:
            if path.stat().st_uid != os.getuid():
                continue
            pid = int((path / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except PermissionError:
            continue
    return removed


def resolve_listen_port(host: str, port: int) -> int:
    """Check that host:port can be bound (clear error if not); port 0 becomes a concrete free port."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise LaunchError(f"cannot resolve front host {host!r}: {exc}") from exc
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"port {port} on {host} is already in use; stop the other server or pick another --port"
                ) from exc
            raise LaunchError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        return int(probe.getsockname()[1])


def url_host(host: str) -> str:
    """The host to put in a URL (and to probe): a wildcard address becomes loopback."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def make_runtime_dir(base: Path | None = None) -> Path:
    """A fresh private runtime dir (mode 0700) holding a pid file, after sweeping stale ones."""
    base = base if base is not None else default_runtime_base()
    for stale in sweep_stale_runtime_dirs(base):
        log.info("removed runtime dir %s of a supervisor that is gone", stale)
    path = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX, dir=base))
    (path / PID_FILE).write_text(f"{os.getpid()}\n")
    return path
