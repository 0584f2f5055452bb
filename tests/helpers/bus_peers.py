"""Test helpers that play a peer over real bus sockets, and real processes for the worker and the engine."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import zmq

from detok_worker.bus.codec import encode, engine_decoder, worker_decoder
from detok_worker.bus.messages import Heartbeat, TokenBatch
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import DetokConfig, load_config

START_TIMEOUT_S = 60.0  # a process start includes loading the tokenizer
_spawn = multiprocessing.get_context("spawn")


@contextmanager
def short_runtime_dir(prefix: str = "dt-") -> Iterator[str]:
    """A private runtime dir (mkdtemp: 0700, as detok requires) with a short path (ipc socket paths are limited to
    ~100 bytes), removed with what is in it on exit."""
    path = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def bus_config(runtime_dir: str, **overrides: Any) -> DetokConfig:
    values = {
        "bus.runtime_dir": runtime_dir,
        "worker.heartbeat_interval_s": 0.1,
        "worker.stats_interval_s": 0.1,
        # generous: a loaded CI machine must not make the engine declare a live worker dead
        "engine.heartbeat_timeout_s": 10.0,
    }
    values.update(overrides)
    return load_config(None, values)


def start_process(target: Callable[..., None], *args: Any, **kwargs: Any) -> multiprocessing.process.BaseProcess:
    process = _spawn.Process(target=target, args=args, kwargs=kwargs, daemon=True)
    process.start()
    return process


def stop_process(process: multiprocessing.process.BaseProcess, timeout: float = 10.0) -> int | None:
    """SIGTERM, wait; SIGKILL if it does not exit. Returns the exit code of the SIGTERM'd process."""
    if process.is_alive() and process.pid is not None:
        os.kill(process.pid, signal.SIGTERM)
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join(5)
        return None
    return process.exitcode


class PlayedEngine:
    """The engine's ROUTER, bound by the test: receives worker messages, sends TokenBatch/Shutdown."""

    def __init__(self, config: DetokConfig) -> None:
        self.sockets = BusSockets(config)
        self.router = self.sockets.worker_router()
        self.decoder = engine_decoder()

    def recv(self, timeout_s: float) -> tuple[bytes, Any] | None:
        if not self.router.poll(int(timeout_s * 1000)):
            return None
        identity, frame = self.router.recv_multipart()
        return identity, self.decoder.decode(frame)

    def expect(self, kind: type, timeout_s: float = 10.0) -> tuple[bytes, Any]:
        """The next message of this type (others are skipped)."""
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            got = self.recv(remaining)
            if got is not None and isinstance(got[1], kind):
                return got
        raise AssertionError(f"no {kind.__name__} within {timeout_s} s")

    def send(self, identity: bytes, message: object) -> None:
        self.router.send_multipart([identity, encode(message)])

    def close(self) -> None:
        self.sockets.close()

    def __enter__(self) -> PlayedEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class PlayedWorker:
    """A worker's DEALER, connected by the test: sends Hello/Heartbeat/Finish, receives TokenBatches."""

    def __init__(self, config: DetokConfig, worker_id: str) -> None:
        self.worker_id = worker_id
        self.sockets = BusSockets(config)
        self.dealer = self.sockets.worker_dealer(worker_id)
        self.decoder = worker_decoder()
        self.last_step = -1  # the last TokenBatch received, reported by `heartbeat`

    def send(self, message: object) -> None:
        self.dealer.send(encode(message))

    def heartbeat(self, load: int) -> None:
        """A Heartbeat reporting the last TokenBatch received as handled (as a real worker does)."""
        self.send(Heartbeat(self.worker_id, load, self.last_step))

    def send_raw(self, *parts: bytes) -> None:
        self.dealer.send_multipart(list(parts))

    def recv(self, timeout_s: float) -> Any | None:
        if not self.dealer.poll(int(timeout_s * 1000)):
            return None
        message = self.decoder.decode(self.dealer.recv())
        if isinstance(message, TokenBatch):
            self.last_step = message.step
        return message

    def close(self) -> None:
        self.sockets.close()

    def __enter__(self) -> PlayedWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def raw_push(config: DetokConfig, endpoint_name: str) -> tuple[BusSockets, zmq.Socket]:
    """A plain PUSH connected to one of the bound endpoints, for sending garbage."""
    sockets = BusSockets(config)
    sock = sockets.engine_push() if endpoint_name == "engine" else sockets.front_push()
    return sockets, sock
