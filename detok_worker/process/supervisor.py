"""`detok serve`: runs front + engine + N workers as child processes and keeps them running.

- Children are `python -m detok_worker.cli <role> --config <runtime_dir>/config.toml`: real, separate processes
  that all read the same effective config. Each runs in its own process group (so a terminal's Ctrl-C reaches
  only the supervisor, which forwards it) and dies with the supervisor even if it is SIGKILLed (PR_SET_PDEATHSIG
  plus a parent watch, see `detok_worker.process.runtime.watch_parent`). They stay in the supervisor's session:
  where the kernel shares the CPU per session (autogroup scheduling) the service is one claimant, as `vllm serve`
  is. A session per process would give the front and each worker a share each, the engine process and a vLLM
  engine core it runs one between them, and the host's other sessions (its clients) less.
- A fresh private (0700) runtime dir per run holds the ipc sockets and the effective config; it is removed at
  exit, and dirs left behind by a SIGKILLed supervisor are swept at the next start (`sweep_stale_runtime_dirs`).
- A dead worker is restarted with exponential backoff (same worker id, so the engine's ROUTER hands its
  routing id over). With front.processes > 1 a dead front is restarted likewise, with its index (its bus PULL;
  at start it tells the engine, which aborts the requests its predecessor left). A dead engine, or the front when
  there is only one, is fatal: everything stops and the exit code is non-zero, for an outer service manager to
  act on.
- Scaling at runtime: SIGTTIN adds a worker, SIGTTOU retires the oldest one gracefully (SIGTERM: it says
  Goodbye and the engine moves its requests), like gunicorn; TTIN then TTOU replaces the oldest process.
- SIGINT/SIGTERM/SIGHUP: SIGTERM to the front, which drains (up to front.drain_timeout_s) while the engine and
  workers still run; then SIGTERM to the others, wait `shutdown_timeout_s`, SIGKILL what is left. A second
  signal skips the waits.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import msgspec

from detok_worker.bus.endpoints import ensure_private_dir, front_endpoints, resolve_endpoints
from detok_worker.bus.errors import BusError
from detok_worker.bus.sockets import check_binds_allowed
from detok_worker.config import DetokConfig, config_to_toml
from detok_worker.config.flags import VLLM_FLAGS_APPLIED_ENV, vllm_flags_digest
from detok_worker.errors import OperatorError
from detok_worker.metrics import METRICS_SUBDIR, child_env, cleanup_metrics_dir, mark_process_dead, prepare_metrics_dir
from detok_worker.process.runtime import PARENT_PID_ENV, Wakeup

# the supervisor's own health probe of its front: the certificate names the served host, not the loopback address
_LOCAL_TLS = ssl.create_default_context()
_LOCAL_TLS.check_hostname = False
_LOCAL_TLS.verify_mode = ssl.CERT_NONE
log = logging.getLogger(__name__)

CONFIG_FILE = "config.toml"
BACKOFF_INITIAL_S = 0.25
BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 10.0  # a worker that ran this long resets its backoff
FRONT_EXIT_MARGIN_S = 3.0  # past its drain timeout, the front's own shutdown (error events, sockets)
# the vLLM source's engine process stopping: vLLM's client gives its engine core VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS
# (5 by default) to exit before it kills it, and the core may first drain under --shutdown-timeout; killing the
# engine process earlier would orphan the core's cleanup
VLLM_ENGINE_EXIT_S = 60.0
SUPERVISE_POLL_S = 2.0  # a fallback: SIGCHLD, stop and scale signals wake the loop at once
EXIT_FAILED = 1
EXIT_PORT_IN_USE = 2


# a child's own process group (Python 3.10 has no process_group: a session of its own there)
OWN_PROCESS_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}

RUNTIME_DIR_PREFIX = "detok-serve-"
PID_FILE = "supervisor.pid"


class LaunchError(OperatorError):
    """`detok serve` cannot start (the message says why, for the operator)."""


class PortInUseError(LaunchError):
    pass


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
    base = base if base is not None else Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    for stale in sweep_stale_runtime_dirs(base):
        log.info("removed runtime dir %s of a supervisor that is gone", stale)
    path = Path(tempfile.mkdtemp(prefix=RUNTIME_DIR_PREFIX, dir=base))
    (path / PID_FILE).write_text(f"{os.getpid()}\n")
    return path


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

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError, AttributeError):  # exited, or never started
            self.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]


def child_argv(role: str, config_path: Path, worker_id: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "detok_worker.cli", role, "--config", str(config_path)]
    if worker_id is not None:
        argv += ["--id", worker_id]
    return argv


def _ipc_paths(endpoints: list[str]) -> list[Path]:
    return [Path(endpoint[len("ipc://") :]) for endpoint in endpoints if endpoint.startswith("ipc://")]


def worker_id(slot: int) -> str:
    return f"{socket.gethostname().split('.')[0] or 'host'}-w{slot}"


class Supervisor:
    """Owns the runtime dir and the child processes of one `detok serve` run."""

    def __init__(
        self,
        config: DetokConfig,
        *,
        with_front: bool = True,
        engine_args: list[str] | None = None,
        startup_timeout_s: float = 60.0,
        shutdown_timeout_s: float = 3.0,
    ) -> None:
        self.config = config
        self.with_front = with_front
        self.engine_args = list(engine_args or [])
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self.children: list[Child] = []
        self.runtime_dir: Path | None = None
        self.config_path: Path | None = None
        self.metrics_dir: Path | None = None
        self._owns_runtime_dir = False
        self._next_slot = 0
        self._scale_requests = 0  # +n: add workers, -n: retire workers (from SIGTTIN/SIGTTOU)
        self._stop = threading.Event()
        self._stop_signals = 0
        self._wakeup = Wakeup()  # a child exited (SIGCHLD), a stop or scale signal: supervise at once

    @property
    def url(self) -> str:
        scheme = "https" if self.config.front.ssl_certfile else "http"
        return f"{scheme}://{url_host(self.config.front.host)}:{self.config.front.port}"

    @property
    def total_restarts(self) -> int:
        return sum(child.restarts for child in self.children)

    @property
    def workers(self) -> list[Child]:
        return [child for child in self.children if child.role == "worker" and child.retire_deadline is None]

    # ---- setup -----------------------------------------------------------------------------------

    def prepare(self) -> None:
        """Concrete port, runtime dir, effective config file, child slots; no processes yet."""
        front = self.config.front
        port = resolve_listen_port(front.host, front.port) if self.with_front else front.port
        try:
            if self.config.bus.runtime_dir:
                runtime_dir = Path(self.config.bus.runtime_dir)
                self._owns_runtime_dir = not runtime_dir.exists()
                ensure_private_dir(runtime_dir)
            else:
                runtime_dir = make_runtime_dir()
                self._owns_runtime_dir = True
            self.runtime_dir = runtime_dir
            self.config = msgspec.structs.replace(
                self.config,
                bus=msgspec.structs.replace(self.config.bus, runtime_dir=str(runtime_dir)),
                front=msgspec.structs.replace(front, port=port),
            )
            check_binds_allowed(self.config)  # fail here, with the reason, rather than in every child
        except BusError as exc:
            raise LaunchError(str(exc)) from exc
        self.config_path = runtime_dir / CONFIG_FILE
        self.metrics_dir = prepare_metrics_dir(runtime_dir)  # Prometheus multiprocess files of every child
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(config_to_toml(self.config))
        self.children = [Child("engine", "engine", child_argv("engine", self.config_path) + self.engine_args)]
        for _ in range(self.config.worker.count):
            self.children.append(self._new_worker_slot())
        if self.with_front:
            for index in range(self.config.front.processes):
                argv = child_argv("front", self.config_path) + (["--index", str(index)] if index else [])
                self.children.append(Child(f"front {index}" if index else "front", "front", argv))

    def _new_worker_slot(self) -> Child:
        assert self.config_path is not None
        wid = worker_id(self._next_slot)
        self._next_slot += 1
        return Child(f"worker {wid}", "worker", child_argv("worker", self.config_path, wid))

    def _spawn(self, child: Child) -> None:
        env = dict(os.environ, **{PARENT_PID_ENV: str(os.getpid())})
        if self.config.engine.source == "vllm":  # the config file holds the vLLM flags' front settings
            env[VLLM_FLAGS_APPLIED_ENV] = vllm_flags_digest(self.config)
        if self.metrics_dir is not None:
            env.update(child_env(self.metrics_dir, restarts=child.restarts if child.role == "worker" else 0))
        child.proc = subprocess.Popen(child.argv, env=env, stdin=subprocess.DEVNULL, **OWN_PROCESS_GROUP)
        child.started_at = time.monotonic()
        child.restart_at = None
        log.info("started %s (pid %d)", child.name, child.proc.pid)

    # ---- signals ---------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_stop_signal)
        signal.signal(signal.SIGTTIN, lambda *_: self.scale(+1))
        signal.signal(signal.SIGTTOU, lambda *_: self.scale(-1))
        signal.signal(signal.SIGCHLD, lambda *_: self._wakeup.set())

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self._stop_signals += 1
        self.request_stop()

    def request_stop(self) -> None:
        self._stop.set()
        self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def scale(self, delta: int) -> None:
        """Ask for `delta` more (or fewer) workers; applied by the supervise loop."""
        self._scale_requests += delta
        self._wakeup.set()

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Prepare, spawn every child, wait until the service answers (raises LaunchError on failure)."""
        if self.runtime_dir is None:
            self.prepare()
        for child in self.children:
            self._spawn(child)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._stop.is_set():
            dead = next((child for child in self.children if not child.alive), None)
            if dead is not None:
                code = dead.proc.returncode if dead.proc else None
                raise LaunchError(f"{dead.name} exited during startup (exit code {code}); see its log above")
            if not self.with_front or (self.front_healthy() and self._fronts_bound()):
                return
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"the front did not become healthy at {self.url}/health within {self.startup_timeout_s:.0f} s"
                )
            self._stop.wait(0.1)

    def front_healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1.0, context=_LOCAL_TLS) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _fronts_bound(self) -> bool:
        """Every front has bound its bus PULL (it is in its lifespan startup, about to accept); checked for ipc
        endpoints only, and only with several fronts (one front answering /health is the whole service)."""
        processes = self.config.front.processes
        if processes == 1:
            return True
        return all(path.exists() for path in _ipc_paths(front_endpoints(resolve_endpoints(self.config), processes)))

    def supervise(self) -> int:
        """Restart dead workers until a stop signal (EXIT 0) or the death of the engine or front (EXIT_FAILED)."""
        while not self._stop.is_set():
            self._wakeup.wait(self._next_check_s())
            if self._stop.is_set():
                break
            failed = self.check_children()
            if failed is not None:
                log.error("%s exited (code %s); stopping the service", failed.name, failed.proc.returncode)  # type: ignore[union-attr]
                return EXIT_FAILED
        return 0

    def _next_check_s(self) -> float:
        """Until the next timed supervision work (a restart's backoff, a leaver's deadline); at most
        SUPERVISE_POLL_S, which is also how late a child's exit is seen without the SIGCHLD handler."""
        now = time.monotonic()
        due = [child.restart_at for child in self.children if child.restart_at is not None]
        due += [child.retire_deadline for child in self.children if child.retire_deadline is not None]
        return min([SUPERVISE_POLL_S, *(at - now for at in due)])

    def check_children(self) -> Child | None:
        """One supervision pass: scale, restart dead workers, retire leavers. Returns a dead engine/front."""
        now = time.monotonic()
        self._apply_scaling(now)
        for child in list(self.children):
            if child.retire_deadline is not None:
                self._check_retiring(child, now)
            elif child.restart_at is not None:
                if now >= child.restart_at:
                    self._spawn(child)
            elif child.alive:
                if child.failures_in_row and now - child.started_at > STABLE_AFTER_S:
                    child.failures_in_row = 0
            elif child.role == "engine" or (child.role == "front" and self.config.front.processes == 1):
                return child
            else:
                self._schedule_restart(child, now)
        return None

    def _forget_live_gauges(self, child: Child) -> None:
        if child.pid is not None and self.metrics_dir is not None:
            mark_process_dead(child.pid, self.metrics_dir)

    def _schedule_restart(self, child: Child, now: float) -> None:
        self._forget_live_gauges(child)
        child.failures_in_row += 1
        child.restarts += 1
        delay = min(BACKOFF_INITIAL_S * 2 ** (child.failures_in_row - 1), BACKOFF_MAX_S)
        child.restart_at = now + delay
        log.warning(
            "%s (pid %s) exited with code %s; restarting in %.2f s (restart #%d of this slot, %d in all)",
            child.name,
            child.pid,
            child.proc.returncode if child.proc else None,
            delay,
            child.restarts,
            self.total_restarts,
        )

    def _apply_scaling(self, now: float) -> None:
        while self._scale_requests > 0:
            self._scale_requests -= 1
            child = self._new_worker_slot()
            self.children.append(child)
            self._spawn(child)
            log.info("scaled up to %d workers", len(self.workers))
        while self._scale_requests < 0:
            self._scale_requests += 1
            active = self.workers
            if len(active) <= 1:
                log.warning("not retiring the last worker")
                self._scale_requests = 0
                break
            child = active[0]  # the oldest, as gunicorn does: TTIN + TTOU rolls a fresh process in
            child.retire_deadline = now + self.shutdown_timeout_s
            if child.alive:
                child.terminate()
            log.info("retiring %s; scaling down to %d workers", child.name, len(self.workers))

    def _check_retiring(self, child: Child, now: float) -> None:
        if child.alive and now < child.retire_deadline:  # type: ignore[operator]
            return
        if child.alive:
            log.warning("%s did not leave in time; killing it", child.name)
        self._kill(child)
        self._forget_live_gauges(child)
        self.children.remove(child)

    def _kill(self, child: Child) -> None:
        if child.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)  # its own process group: grandchildren too, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=2.0)

    def stop_children(self) -> None:
        """SIGTERM the front first and let it drain (the engine and workers keep serving its live requests for up
        to front.drain_timeout_s); then SIGTERM the others, wait up to shutdown_timeout_s, SIGKILL the rest."""
        fronts = [child for child in self.children if child.role == "front" and child.alive]
        self._terminate(fronts, self.config.front.drain_timeout_s + FRONT_EXIT_MARGIN_S)
        self._terminate([child for child in self.children if child.alive], self.shutdown_timeout_s)
        if self.config.engine.source == "vllm":  # vLLM's engine core stops as under `vllm serve`, not killed
            self._wait_exit([child for child in self.children if child.role == "engine"], VLLM_ENGINE_EXIT_S)
        for child in self.children:
            if child.alive:
                log.warning("%s (pid %s) did not exit in time; killing it", child.name, child.pid)
            self._kill(child)

    def _terminate(self, children: list[Child], timeout_s: float) -> None:
        """SIGTERM `children` and wait up to timeout_s for them to exit (a second stop signal cuts the wait)."""
        for child in children:
            child.terminate()
        self._wait_exit(children, timeout_s)

    def _wait_exit(self, children: list[Child], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(child.alive for child in children) and time.monotonic() < deadline and self._stop_signals < 2:
            time.sleep(0.02)

    def cleanup(self) -> None:
        """Remove the runtime dir (or, for an operator-given dir, only our files in it)."""
        if self.runtime_dir is None:
            return
        if self._owns_runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
            return
        endpoints = resolve_endpoints(self.config)
        fronts = front_endpoints(endpoints, self.config.front.processes)
        for path in [*_ipc_paths([endpoints.engine, endpoints.workers, *fronts]), self.runtime_dir / CONFIG_FILE]:
            with contextlib.suppress(OSError):
                path.unlink()
        cleanup_metrics_dir(self.runtime_dir / METRICS_SUBDIR)

    def close(self) -> None:
        self.stop_children()
        self.cleanup()


def serve(config: DetokConfig, *, startup_timeout_s: float = 60.0, out: TextIO | None = None) -> int:
    """Run the whole service until SIGINT/SIGTERM. Returns the process exit code."""
    out = out if out is not None else sys.stdout
    supervisor = Supervisor(config, startup_timeout_s=startup_timeout_s)
    supervisor.install_signal_handlers()
    try:
        try:
            supervisor.start()
        except LaunchError as exc:
            print(f"detok serve: startup failed: {exc}", file=sys.stderr, flush=True)
            return EXIT_PORT_IN_USE if isinstance(exc, PortInUseError) else EXIT_FAILED
        if supervisor.stopping:
            return 0
        workers = len(supervisor.workers)
        fronts = config.front.processes
        processes = f"{workers} workers" + (f", {fronts} fronts" if fronts > 1 else "")
        print(f"detok serving at {supervisor.url} ({processes}; Ctrl-C to stop)", file=out, flush=True)
        log.info("runtime dir %s", supervisor.runtime_dir)
        code = supervisor.supervise()
        log.info("stopping (worker restarts during this run: %d)", supervisor.total_restarts)
        return code
    finally:
        supervisor.close()
