"""The front's frames to the engine (Submit, Abort, Delivered, FrontHello), in the order they are posted.

The frames posted while nothing waits before them are sent together at the end of the event loop's current round
(one callback, no task wakeup: a Submit and a Delivered per request), back to back: a send that finds ZeroMQ's I/O
thread asleep wakes it, which costs more than the send itself, and sends in a row find it awake. A frame the PUSH
socket has no room for, and every frame after it, is queued for the one sender task, which waits only while the
socket is full (an engine slow to read). Either way a rid's Abort never overtakes its Submit. A failed send is not
fatal: the engine's reconnect brings the bus back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import Any

import zmq
import zmq.asyncio

from detok_worker.process.logs import RateLimiter, warn_rate_limited

log = logging.getLogger(__name__)
_send_faults = RateLimiter(interval_s=10.0)


class EngineOutbox:
    def __init__(self, counters: Counter[str]) -> None:
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._sender: zmq.Socket[Any] | None = None  # the PUSH socket, once `run` has started
        self._in_flight = False  # the sender task holds a frame it has not sent yet
        self._burst: list[bytes] = []  # frames to send at the end of this loop round, in order
        self._counters = counters

    def post(self, frame: bytes) -> None:
        burst = self._burst
        if burst:
            burst.append(frame)
        elif self._sender is not None and not self._in_flight and self._queue.empty():
            burst.append(frame)
            asyncio.get_running_loop().call_soon(self._send_burst)
        else:
            self._queue.put_nowait(frame)

    def _send_burst(self) -> None:
        """Send the round's frames without blocking; from the first the socket refuses on, they queue in order."""
        burst, self._burst = self._burst, []
        sender = self._sender
        for frame in burst:
            if sender is None:
                self._queue.put_nowait(frame)
                continue
            try:
                sender.send(frame, zmq.NOBLOCK)
            except zmq.Again:
                sender = None
                self._queue.put_nowait(frame)
            except zmq.ZMQError as exc:
                self._failed(exc)

    def queued(self) -> int:
        return self._queue.qsize() + len(self._burst)

    async def flush(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the posted frames to be sent."""
        if self._burst:
            self._send_burst()
        if self._queue.qsize():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout=timeout_s)

    def stop(self) -> None:
        """The socket is about to close: no more sends at once (the task is cancelled by its owner)."""
        self._sender = None

    async def run(self, push: zmq.asyncio.Socket) -> None:
        """The sender task: per wakeup every queued frame, each sent without blocking when the socket has room
        (pyzmq's asyncio send makes a Future per frame); only a full socket waits."""
        sender = self._sender = zmq.Socket.shadow(push.underlying)
        while True:
            frame = await self._queue.get()
            self._in_flight = True
            while True:
                try:
                    try:
                        sender.send(frame, zmq.NOBLOCK)
                    except zmq.Again:
                        await push.send(frame)
                except zmq.ZMQError as exc:
                    self._failed(exc)
                finally:
                    self._queue.task_done()
                try:
                    frame = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    self._in_flight = False
                    break

    def _failed(self, exc: zmq.ZMQError) -> None:
        self._counters["send_errors"] += 1
        warn_rate_limited(log, _send_faults, "send", "cannot send to the engine: %s", exc)
