"""SIGINT/SIGTERM -> a stop callback, for the plain-loop processes (worker, engine)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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
