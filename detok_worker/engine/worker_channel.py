"""The engine's side of its connection to the detok workers, a part of EngineLink (link.py).

`WorkerChannel` owns the engine's ROUTER to the workers: it takes Hello/Heartbeat/Finish/Goodbye into the
Scheduler (worker liveness: a worker that restarted, left, or is silent for engine.heartbeat_timeout_s loses its
requests to live workers; a Finish stops its rid), tells a worker holding rids the engine does not know to rejoin,
and sends without blocking: a message a full worker queue cannot take is counted in `blocked_sends` (the caller
plans it again at the next step), a worker the ROUTER reports unreachable is declared lost.
For the workers that are this engine's siblings (same supervisor, same host) it measures the time each waited for a
CPU since its last heartbeat (cpu_wait.py) once it is overdue: a starved worker is not lost for that time.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from detok_worker.bus.codec import BAD_MULTIPART, FrameDecoder, encode
from detok_worker.bus.messages import Finish, Goodbye, Heartbeat, Hello, Shutdown, ToEngine
from detok_worker.engine.cpu_wait import cpu_wait_s, is_sibling, waiting_now_s
from detok_worker.engine.front_channel import BAD_UNEXPECTED, FRAMES_PER_WAKEUP, BusNews
from detok_worker.engine.scheduler import Scheduler
from detok_worker.trace.format import TraceWriter

log = logging.getLogger(__name__)

BAD_WORKER_ID = "worker_id"  # a worker message whose routing id is not a UTF-8 worker id
STALE_WORKER = "you hold requests this engine does not know (declared dead, or the engine restarted)"


class WorkerChannel:
    def __init__(
        self,
        router: zmq.Socket[Any],
        scheduler: Scheduler,
        decoder: FrameDecoder[ToEngine],
        recorder: TraceWriter | None,
        heartbeat_interval_s: float = 0.0,
    ) -> None:
        """`heartbeat_interval_s`: the workers' (worker.heartbeat_interval_s), the longest a live worker sleeps."""
        self.router = router
        self.heartbeat_interval_s = heartbeat_interval_s
        self.scheduler = scheduler
        self.decoder = decoder
        self.recorder = recorder
        self.blocked_sends = 0
        self.goodbyes = 0  # workers that said Goodbye and whose connection has not closed yet (an expected drop)
        self._siblings: dict[str, int] = {}  # worker -> pid, for the workers whose CPU wait is measurable
        self._wait_at_seen: dict[str, float] = {}  # worker -> its CPU wait at its last heartbeat (cpu_wait.py)

    def drain(self, news: BusNews, now: float) -> bool:
        """Take what the workers sent (up to FRAMES_PER_WAKEUP frames); stopped rids go into `news`. True when a
        worker joined or left (the fronts should learn of it now, not at the next stats interval)."""
        scheduler = self.scheduler
        joined_or_left = False
        for _ in range(FRAMES_PER_WAKEUP):
            try:
                parts = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(parts) != 2:
                self.decoder.count_bad(BAD_MULTIPART, f"{len(parts)} parts")
                continue
            identity, frame = parts
            try:
                worker = identity.decode("utf-8")
            except UnicodeDecodeError:  # a DEALER without ROUTING_ID: nothing could be routed back to it by name
                self.decoder.count_bad(BAD_WORKER_ID, identity)
                continue
            message = self.decoder.decode(frame)
            if isinstance(message, Heartbeat):
                if not scheduler.heartbeat(worker, message.load, now, message.step, message.blocked):
                    self.send(identity, Shutdown(STALE_WORKER, rejoin=True))
                elif (pid := self._siblings.get(worker)) is not None:
                    self._sample_wait(worker, pid)
            elif isinstance(message, Finish):
                if scheduler.finish(message.rid, worker):
                    news.stopped.append(message.rid)
                    news.finishes[message.rid] = message
                    if self.recorder is not None:
                        self.recorder.tokens(message.rid, [], message.reason)
                else:  # the rid ended in the engine first: the worker's verdict on its end (the stats read it)
                    news.finishes[message.rid] = message
            elif isinstance(message, Hello):
                log.info("engine: worker %s (pid %d) is alive", worker, message.pid)
                lost_before = scheduler.lost_workers
                scheduler.hello(worker, message.pid, now)
                if scheduler.lost_workers > lost_before:
                    log.warning("engine: worker %s restarted; %s", worker, self._lost_note())
                self._forget(worker)  # a new process: its CPU wait is measured afresh
                if is_sibling(message.pid):
                    self._siblings[worker] = message.pid
                    self._sample_wait(worker, message.pid)
                joined_or_left = True
            elif isinstance(message, Goodbye):
                log.info("engine: worker %s leaves", worker)
                scheduler.goodbye(worker)
                self._forget(worker)
                self.goodbyes += 1
                joined_or_left = True
            elif message is not None:
                self.decoder.count_bad(BAD_UNEXPECTED, type(message).__name__)
        return joined_or_left

    def expire(self, now: float) -> None:
        """Declare lost the workers silent for too long (the time an overdue sibling waited for a CPU apart); their
        requests are re-opened elsewhere."""
        registry = self.scheduler.registry
        for info in registry.overdue(now):
            pid = self._siblings.get(info.worker)
            before = self._wait_at_seen.get(info.worker)
            if pid is not None and before is not None and (waited := cpu_wait_s(pid)) is not None:
                registry.excuse_starved(info.worker, waited - before + waiting_now_s(pid, self.heartbeat_interval_s))
        for worker in self.scheduler.expire_workers(now):
            # its pid stays known: a worker judged lost that is still alive (starved) joins again by its heartbeats,
            # without a Hello (a new process always says Hello first), and its CPU wait must still be measured
            self._wait_at_seen.pop(worker, None)
            log.warning(
                "engine: worker %s missed its heartbeats or left its TokenBatches unanswered for "
                "engine.batch_answer_timeout_s; re-opening its requests elsewhere; %s",
                worker,
                self._lost_note(),
            )

    def _sample_wait(self, worker: str, pid: int) -> None:
        if (waited := cpu_wait_s(pid)) is not None:
            self._wait_at_seen[worker] = waited

    def _forget(self, worker: str) -> None:
        self._siblings.pop(worker, None)
        self._wait_at_seen.pop(worker, None)

    def _lost_note(self) -> str:
        return f"{self.scheduler.lost_workers} worker(s) declared lost since the engine started"

    def send(self, identity: bytes, message: object) -> bool:
        try:
            self.router.send_multipart([identity, encode(message)], zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.blocked_sends += 1  # its queue is full: retried next step
            return False
        except zmq.ZMQError as exc:
            worker = identity.decode("utf-8", "replace")
            self.scheduler.worker_unreachable(worker)
            self._forget(worker)
            log.warning(
                "engine: cannot send to worker %s (%s); re-opening its requests elsewhere; %s",
                worker,
                exc,
                self._lost_note(),
            )
            return False
