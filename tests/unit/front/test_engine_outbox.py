"""EngineOutbox: the frames posted while nothing waits before them go out together at the end of the loop's round;
a frame the socket refuses, and every one after it, queues behind, so the order of a rid's frames (Submit before
Abort) holds whatever the socket does."""

from __future__ import annotations

import asyncio
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


async def next_round() -> None:
    await asyncio.sleep(0)


def test_frames_keep_their_order_through_a_full_socket() -> None:
    async def scenario() -> None:
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
        outbox.post(b"submit-b")  # nothing waits: sent at the end of this round, with what follows in it
        outbox.post(b"submit-c")
        assert socket.sent == [b"hello", b"submit-a"] and outbox.queued() == 2
        await next_round()
        assert socket.sent == [b"hello", b"submit-a", b"submit-b", b"submit-c"] and outbox.queued() == 0
        socket.full = True
        outbox.post(b"abort-b")  # the socket is full at the round's end: queued for the sender task
        await next_round()
        socket.full = False
        outbox.post(b"delivered-c")  # must not overtake abort-b
        await next_round()
        assert socket.sent == [b"hello", b"submit-a", b"submit-b", b"submit-c"] and outbox.queued() == 2
        assert [sender.get_nowait(), sender.get_nowait()] == [b"abort-b", b"delivered-c"]

    asyncio.run(scenario())


def test_flush_sends_the_rounds_frames_at_once() -> None:
    async def scenario() -> None:
        outbox = EngineOutbox(Counter())
        socket = Socket()
        outbox._sender = socket  # type: ignore[assignment]
        outbox.post(b"abort-a")
        outbox.post(b"abort-b")
        await outbox.flush(timeout_s=0.1)  # the shutdown: sent before the sockets close
        assert socket.sent == [b"abort-a", b"abort-b"] and outbox.queued() == 0

    asyncio.run(scenario())
