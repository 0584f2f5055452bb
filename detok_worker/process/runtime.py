"""What each detok process uses to run and to stop.

- `run_event_loop`: the asyncio event loop of the asyncio processes (the gRPC gateway, the vLLM relay, the engine
  server; the front's is uvicorn's, which picks uvloop the same way): uvloop when it is installed (a dependency
  except on Windows), else asyncio's own. grpc.aio runs on any asyncio loop, and on uvloop a Generate stream's
  message costs less CPU.
- `stop_on_signals`: SIGINT/SIGTERM -> a stop callback, for the plain-loop processes (worker, engine).
- `Wakeup`: a wakeup a signal handler can raise safely: a non-blocking self-pipe (no lock to deadlock on when the
  handler runs while the main thread is inside the waiting call). The supervisor waits on it instead of polling
  its children: SIGCHLD, stop and scale signals wake it at once, its timers by the timeout.
- `watch_parent`: children of `detok serve` die with their supervisor, even when it is SIGKILLed and cannot
  forward a signal. The supervisor puts its pid in DETOK_PARENT_PID. A child then (1) asks Linux to send it
  SIGTERM when the parent dies (PR_SET_PDEATHSIG), and (2) runs a watch thread that notices a changed parent pid on
  any POSIX system, sends itself SIGTERM (the process's own clean shutdown path) and, if that has not ended the
  process within a grace period, exits hard. It also ignores SIGTTOU: in its own process group a child is a
  background job of the supervisor's terminal, which `stty tostop` would stop at its first log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_on_signals(callback: Callable[[], None]) -> Iterator[None]:
    """Call `callback` on SIGINT/SIGTERM while inside the block; restores the previous handlers after.
    Outside the main thread signals cannot be caught: the caller then stops the loop itself."""
    previous: dict[int, Any] = {}
    try:
        for signum in STOP_SIGNALS:
            previous[signum] = signal.signal(signum, lambda *_: callback())
    except ValueError:
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Wakeup:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def fileno(self) -> int:
        """The read end, for a poller that waits on other sockets too (it becomes readable on `set()`)."""
        return self._read

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # full pipe: a wakeup is already pending
            os.write(self._write, b"\0")

    def wait(self, timeout_s: float) -> bool:
        """Up to timeout_s for a `set()` since the last wait; True when one came (all pending ones are taken)."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, timeout_s))
        if not ready:
            return False
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 4096):
                pass
        return True


PARENT_PID_ENV = "DETOK_PARENT_PID"
_PR_SET_PDEATHSIG = 1
POLL_INTERVAL_S = 0.5
# With the death signal armed the watch is only the fallback (a SIGTERM the process does not act on): it may look
# rarely, as every wakeup of an idle process costs CPU.
ARMED_POLL_INTERVAL_S = 5.0
GRACE_S = 5.0


def _set_parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    return False


def _watch(parent_pid: int, interval_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval_s)
    log.warning("supervisor (pid %d) is gone; shutting down", parent_pid)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


def watch_parent() -> int | None:
    """Tie this process's life to the supervisor named in the environment, if any, and ignore SIGTTOU (see the
    module doc). Returns its pid."""
    value = os.environ.get(PARENT_PID_ENV)
    if not value:
        return None
    try:
        parent_pid = int(value)
    except ValueError:
        log.warning("ignoring %s=%r (not a pid)", PARENT_PID_ENV, value)
        return None
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    armed = _set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent_pid:  # the supervisor died before the death signal was armed
        os._exit(1)
    interval_s = ARMED_POLL_INTERVAL_S if armed else POLL_INTERVAL_S
    threading.Thread(target=_watch, args=(parent_pid, interval_s), name="parent-watch", daemon=True).start()
    return parent_pid
