"""Children of `detok serve` die with their supervisor, even when it is SIGKILLed and cannot forward a signal.

The supervisor puts its pid in DETOK_PARENT_PID. A child then (1) asks Linux to send it SIGTERM when the parent
dies (PR_SET_PDEATHSIG), and (2) runs a watch thread that notices a changed parent pid on any POSIX system,
sends itself SIGTERM (the process's own clean shutdown path) and, if that has not ended the process within
a grace period, exits hard.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading
import time

log = logging.getLogger(__name__)

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
    """Tie this process's life to the supervisor named in the environment, if any. Returns its pid."""
    value = os.environ.get(PARENT_PID_ENV)
    if not value:
        return None
    try:
        parent_pid = int(value)
    except ValueError:
        log.warning("ignoring %s=%r (not a pid)", PARENT_PID_ENV, value)
        return None
    armed = _set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent_pid:  # the supervisor died before the death signal was armed
        os._exit(1)
    interval_s = ARMED_POLL_INTERVAL_S if armed else POLL_INTERVAL_S
    threading.Thread(target=_watch, args=(parent_pid, interval_s), name="parent-watch", daemon=True).start()
    return parent_pid
