"""The supervisor's wakeup: a signal handler's set() ends a wait at once; without one the wait lasts its timeout;
wakeups that pile up are taken by one wait."""

from __future__ import annotations

import os
import signal
import threading
import time

from detok_worker.process.runtime import Wakeup


def test_a_wait_without_a_set_lasts_its_timeout() -> None:
    wakeup = Wakeup()
    started = time.monotonic()
    assert wakeup.wait(0.2) is False
    assert time.monotonic() - started >= 0.19


def test_a_signal_handler_wakes_a_waiting_main_thread() -> None:
    wakeup = Wakeup()
    previous = signal.signal(signal.SIGUSR1, lambda *_: wakeup.set())
    try:
        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        started = time.monotonic()
        assert wakeup.wait(10.0) is True
        assert time.monotonic() - started < 5.0
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_many_sets_are_taken_by_one_wait() -> None:
    wakeup = Wakeup()
    for _ in range(100_000):  # more than the pipe holds: set() never blocks
        wakeup.set()
    assert wakeup.wait(0.0) is True
    assert wakeup.wait(0.05) is False
