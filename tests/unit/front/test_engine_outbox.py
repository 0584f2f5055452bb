"""EngineOutbox: a frame goes out at once only while nothing waits before it; otherwise it queues behind, so the
order of a rid's frames (Submit before Abort) holds whatever the socket does."""

from __future__ import annotations

from collections import Counter
from typing import Any

import zmq

from detok_worker.front.engine_outbox import EngineOutbox


class Socket:
    """A PUSH socket stand-in: refuses sends (zmq.Again) while `full`."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.full = False

    def send(self, frame: bytes, flags: int = 0) -> None:
        if self.full:
            raise zmq.Again()
        self.sent.append(frame)


def test_frames_keep_their_order_through_a_full_socket() -> None:
    outbox = EngineOutbox(Counter())
    socket = Socket()
    outbox.post(b"hello")  # before the sender task runs: queued
    assert outbox.queued() == 1 and socket.sent == []
    outbox._sender = socket  # type: ignore[assignment]  # what `run` sets up; the queue is drained below
    outbox.post(b"submit-a")  # something queued before it: it queues too
    assert outbox.queued() == 2 and socket.sent == []
    sender: Any = outbox._queue
    socket.sent += [sender.get_nowait(), sender.get_nowait()]  # the sender task's turn
    sender.task_done()
    sender.task_done()
    outbox.post(b"submit-b")  # nothing waits: sent at once
    assert socket.sent == [b"hello", b"submit-a", b"submit-b"]
    socket.full = True
    outbox.post(b"abort-b")  # the socket is full: queued for the sender task
    socket.full = False
    outbox.post(b"delivered-c")  # must not overtake abort-b
    assert socket.sent == [b"hello", b"submit-a", b"submit-b"] and outbox.queued() == 2
