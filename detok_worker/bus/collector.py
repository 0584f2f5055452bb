"""A front without HTTP: binds the front's PULL, optionally submits to the engine, and collects every request's
text exactly once (bus/reassembly.py). For `detok trace replay`, benchmarks
and tests that play the front.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq

from detok_worker.bus.codec import encode, front_decoder
from detok_worker.bus.columns import text_deltas
from detok_worker.bus.messages import (
    FINISH_ERROR,
    Abort,
    Delivered,
    EngineStats,
    Reject,
    RequestParams,
    Submit,
    TextBatch,
    TextDelta,
    WorkerStats,
)
from detok_worker.bus.reassembly import GAP_ERROR, DeltaReassembly
from detok_worker.bus.sockets import BusSockets, recv_single_frame
from detok_worker.config import DetokConfig


@dataclass(slots=True)
class CollectedRequest:
    """One request's text as a client would see it."""

    rid: str
    parts: list[str] = field(default_factory=list)
    reassembly: DeltaReassembly = field(default_factory=DeltaReassembly)
    n_tokens: int = 0
    finish: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    rejected: bool = False
    first_ns: int | None = None  # wall clock of the first and last received text
    last_ns: int | None = None

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    @property
    def chars(self) -> int:
        return self.reassembly.delivered

    @property
    def duplicate_chars(self) -> int:
        """Re-sent characters dropped (a re-open replays text from offset 0)."""
        return self.reassembly.duplicate_chars

    @property
    def gaps(self) -> int:
        """1 when a delta started past the delivered text (text was lost upstream: must stay 0)."""
        return int(self.reassembly.gap)

    @property
    def done(self) -> bool:
        return self.finish is not None

    def apply(self, delta: TextDelta, now_ns: int = 0) -> str:
        """Take a delta; returns the text newly delivered by it (nothing after the request ended)."""
        if self.finish is not None:
            return ""
        new = self.reassembly.take(delta)
        if new is None:
            self.finish, self.error = FINISH_ERROR, GAP_ERROR
            return ""
        if new:
            self.parts.append(new)
            if self.first_ns is None:
                self.first_ns = now_ns
            self.last_ns = now_ns
        self.n_tokens = max(self.n_tokens, delta.n_tokens)
        if delta.finish is not None:
            self.finish, self.stop_reason, self.error = delta.finish, delta.stop_reason, delta.error
        return new

    def reject(self, error: str) -> None:
        if self.finish is None:
            self.finish, self.error, self.rejected = FINISH_ERROR, error, True


class FrontCollector:
    """Plays the front over real sockets. Not thread-safe; call poll()/wait_* from one thread."""

    def __init__(self, config: DetokConfig, context: zmq.Context[Any] | None = None) -> None:
        self.sockets = BusSockets(config, context)
        self.pull = self.sockets.front_pull()
        self._push: zmq.Socket[Any] | None = None
        self.decoder = front_decoder()
        self.requests: dict[str, CollectedRequest] = {}
        self.worker_stats: dict[str, WorkerStats] = {}
        self.engine_stats: EngineStats | None = None
        self.latencies_ns: list[int] = []  # per TextBatch with rows: receive time - the engine's send time
        self.text_batches = 0

    # ---- to the engine ----------------------------------------------------------------------------------

    def submit(self, rid: str, prompt_ids: list[int], params: RequestParams) -> CollectedRequest:
        request = self.requests.setdefault(rid, CollectedRequest(rid))
        self._engine().send(encode(Submit(rid, list(prompt_ids), params, time.time_ns())))
        return request

    def abort(self, rid: str) -> None:
        self._engine().send(encode(Abort(rid)))

    def _engine(self) -> zmq.Socket[Any]:
        if self._push is None:
            self._push = self.sockets.engine_push()
        return self._push

    # ---- from workers and the engine ------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0) -> int:
        """Handle every frame that is ready, waiting up to timeout_ms for the first. Returns frames handled."""
        handled = 0
        if not self.pull.poll(timeout_ms):
            return 0
        while True:
            try:
                frame = recv_single_frame(self.pull, self.decoder)
            except zmq.Again:
                return handled
            handled += 1
            if frame is not None:
                self.handle_frame(frame)

    def handle_frame(self, frame: bytes) -> None:
        message = self.decoder.decode(frame)
        if isinstance(message, TextBatch):
            self._text_batch(message)
        elif isinstance(message, WorkerStats):
            self.worker_stats[message.worker] = message
        elif isinstance(message, EngineStats):
            self.engine_stats = message
        elif isinstance(message, Reject):
            self.requests.setdefault(message.rid, CollectedRequest(message.rid)).reject(message.error)

    def _text_batch(self, batch: TextBatch) -> None:
        self.text_batches += 1
        if not batch.rids:
            return
        now_ns = time.time_ns()
        self.latencies_ns.append(now_ns - batch.sent_ns)
        requests = self.requests
        for delta in text_deltas(batch):
            request = requests.get(delta.rid)
            if request is None:
                request = requests[delta.rid] = CollectedRequest(delta.rid)
            if request.done:
                continue
            request.apply(delta, now_ns)
            if request.done and self._push is not None:  # we submit, so we confirm: the engine may forget the rid
                self._push.send(encode(Delivered(delta.rid)))

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Poll until predicate() holds; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll(min(100, int(remaining * 1000) + 1))
        return True

    def wait_done(self, rids: Iterable[str], timeout_s: float) -> bool:
        """Wait until every rid has ended (finish or Reject)."""
        requests, rids = self.requests, list(rids)
        return self.wait_for(lambda: all(rid in requests and requests[rid].done for rid in rids), timeout_s)

    def close(self) -> None:
        self.sockets.close()

    def __enter__(self) -> FrontCollector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
