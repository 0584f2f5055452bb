"""A wakeup a signal handler can raise safely: a non-blocking self-pipe (no lock to deadlock on when the handler
runs while the main thread is inside the waiting call). The supervisor waits on it instead of polling its
children: SIGCHLD, stop and scale signals wake it at once, its timers by the timeout."""

from __future__ import annotations

import contextlib
import os
import select


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
