"""The engine's registry of live detok workers: who is alive (Hello, heartbeats), which rids each one owns, and
who is lost (heartbeat timeout, Goodbye, unreachable, a Hello that shows a restart). Pure: the caller passes the
clock and re-opens a lost worker's rids (detok_worker/engine/scheduler.py).

Liveness has two parts: heartbeats (the worker's process is alive) and progress (its heartbeats report the last
TokenBatch step it handled): a worker that heartbeats but handles none of the batches sent to it for
answer_timeout_s (0 = never checked) is lost like a silent one, unless it says it is blocked on the front."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class WorkerInfo:
    worker: str
    pid: int
    last_seen: float
    rids: set[str] = field(default_factory=set)
    sent_step: int = -1  # the last TokenBatch step sent to it
    answered_step: int = -1  # the last step its heartbeats say it handled
    waiting_since: float | None = None  # since when it owes an answer without progress
    columns: bool = False  # it reads TokenBatch columns (Hello/Heartbeat.columns); else items only


class WorkerRegistry:
    def __init__(self, heartbeat_timeout_s: float, answer_timeout_s: float = 0.0) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.answer_timeout_s = answer_timeout_s
        self.workers: dict[str, WorkerInfo] = {}

    def __contains__(self, worker: str) -> bool:
        return worker in self.workers

    def __bool__(self) -> bool:
        return bool(self.workers)

    def get(self, worker: str) -> WorkerInfo | None:
        return self.workers.get(worker)

    def names(self) -> list[str]:
        return list(self.workers)

    def loads(self) -> dict[str, int]:
        return {worker: len(info.rids) for worker, info in self.workers.items()}

    def least_loaded(self) -> WorkerInfo | None:
        return min(self.workers.values(), key=lambda w: len(w.rids)) if self.workers else None

    def hello(self, worker: str, pid: int, now: float, columns: bool = False) -> WorkerInfo | None:
        """Register a (re)started worker; returns its previous incarnation, whose rids are lost."""
        lost = self.workers.pop(worker, None)
        self.workers[worker] = WorkerInfo(worker, pid, now, columns=columns)
        return lost

    def reads_columns(self, worker: str) -> bool:
        info = self.workers.get(worker)
        return info is not None and info.columns

    def heartbeat(
        self, worker: str, load: int, now: float, step: int = -1, blocked: bool = False, columns: bool = False
    ) -> bool:
        """False when an unregistered worker still holds rids (see Scheduler.heartbeat); one without joins."""
        info = self.workers.get(worker)
        if info is not None:
            info.last_seen = now
            info.columns = columns
            if blocked or step >= info.sent_step:
                info.waiting_since = None
            elif step > info.answered_step:
                info.waiting_since = now  # progress: it owes less than before
            info.answered_step = max(info.answered_step, step)
            return True
        if load > 0:
            return False
        self.workers[worker] = WorkerInfo(worker, -1, now, columns=columns)
        return True

    def sent(self, worker: str, step: int, now: float) -> None:
        """A TokenBatch of `step` went to `worker`: it owes an answer."""
        info = self.workers.get(worker)
        if info is not None:
            info.sent_step = step
            if info.waiting_since is None:
                info.waiting_since = now

    def remove(self, worker: str) -> WorkerInfo | None:
        return self.workers.pop(worker, None)

    def silent(self, now: float) -> list[str]:
        """Workers without a heartbeat for longer than the timeout (still registered: the caller removes them)."""
        return [w for w, info in self.workers.items() if now - info.last_seen > self.heartbeat_timeout_s]

    def unresponsive(self, now: float) -> list[str]:
        """Workers that heartbeat but have handled none of their TokenBatches for longer than answer_timeout_s."""
        if self.answer_timeout_s <= 0:
            return []
        limit = self.answer_timeout_s
        return [
            w for w, info in self.workers.items() if info.waiting_since is not None and now - info.waiting_since > limit
        ]
