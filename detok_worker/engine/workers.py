"""The engine's registry of live detok workers: who is alive (Hello, heartbeats), which rids each one owns, and
who is lost (heartbeat timeout, Goodbye, unreachable, a Hello that shows a restart). Pure: the caller passes the
clock and re-opens a lost worker's rids (detok_worker/engine/scheduler.py).

Liveness has two parts: heartbeats (the worker's process is alive) and progress (its heartbeats report the last
TokenBatch step it handled): a worker that heartbeats but handles none of the batches sent to it for
answer_timeout_s (0 = never checked) is lost like a silent one, unless it says it is blocked on the front.
Silence counts only the time in which a heartbeat could have come through: a stall of the engine's own loop
(`excuse_stall`, for every worker) and the time a worker waited for a CPU (`excuse_starved`, measured by the caller)
since its last heartbeat extend its deadline; a stopped or dead worker earns neither and is lost on time.

Stop-string budget: each worker holds at most worker.max_live_stop_chars characters of its live rids' stop strings
(the worker refuses an Open past it). The registry counts them as the worker will when it reads its batches, never
less: a rid's characters are taken when it is placed and given back once the worker has its end (the batch with its
last ids was sent, its Finish came, or the batch with its abort item was sent: a batch's Opens come before its
items, so until then a new Open would still find them counted), so a request that fits here fits there."""

from __future__ import annotations

from dataclasses import dataclass, field

from detok_worker.bus.messages import REJECT_INVALID, REJECT_STOP_BUDGET, Reject


@dataclass(slots=True)
class WorkerInfo:
    worker: str
    pid: int
    last_seen: float
    rids: set[str] = field(default_factory=set)
    sent_step: int = -1  # the last TokenBatch step sent to it
    answered_step: int = -1  # the last step its heartbeats say it handled
    waiting_since: float | None = None  # since when it owes an answer without progress
    stop_chars: int = 0  # stop-string characters of its rids, as the worker counts them (see the module doc)
    stop_chars_ending: int = 0  # of those, the rids whose abort item waits to be sent to it
    stalled_s: float = 0.0  # the engine's loop stalls since its last heartbeat (see the module doc)
    starved_s: float = 0.0  # the time it waited for a CPU since its last heartbeat (see the module doc)


class WorkerRegistry:
    def __init__(
        self, heartbeat_timeout_s: float, answer_timeout_s: float = 0.0, max_live_stop_chars: int | None = None
    ) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.answer_timeout_s = answer_timeout_s
        self.max_live_stop_chars = max_live_stop_chars  # None = no budget
        self.workers: dict[str, WorkerInfo] = {}

    def __contains__(self, worker: str) -> bool:
        return worker in self.workers

    def __bool__(self) -> bool:
        return bool(self.workers)

    def names(self) -> list[str]:
        return list(self.workers)

    def loads(self) -> dict[str, int]:
        return {worker: len(info.rids) for worker, info in self.workers.items()}

    def least_loaded(self, stop_chars: int = 0) -> WorkerInfo | None:
        """The worker with the fewest rids among those with room for `stop_chars` more stop-string characters (a
        rid without stop strings fits anywhere, as in the worker's own check); None when no worker has room."""
        budget = self.max_live_stop_chars
        if stop_chars and budget is not None:
            fitting = [w for w in self.workers.values() if w.stop_chars + stop_chars <= budget]
            return min(fitting, key=lambda w: len(w.rids)) if fitting else None
        return min(self.workers.values(), key=lambda w: len(w.rids)) if self.workers else None

    def place(self, rid: str, stop_chars: int, *, anywhere: bool = False) -> WorkerInfo | None:
        """Give `rid` the least loaded worker with room for its `stop_chars` (with `anywhere`, the least loaded one
        when none has room); None when none is alive or has room."""
        info = self.least_loaded(stop_chars)
        if info is None and anywhere:
            info = self.least_loaded()
        if info is not None:
            info.rids.add(rid)
            info.stop_chars += stop_chars
        return info

    def refusal(self, rid: str, stop_chars: int) -> Reject:
        """The Reject of a new request no live worker has room for."""
        budget = self.max_live_stop_chars
        held = f"{stop_chars} characters of stop strings"
        if budget is not None and stop_chars > budget:  # more than a worker ever holds: retrying cannot help
            message = f"the request has {held}, more than a detok worker holds (worker.max_live_stop_chars = {budget})"
            return Reject(rid, f"{message}: use fewer or shorter stop strings", kind=REJECT_INVALID)
        message = f"no detok worker has room for {held} more (worker.max_live_stop_chars = {budget} per worker)"
        return Reject(rid, f"{message}: retry later, or use fewer or shorter stop strings", kind=REJECT_STOP_BUDGET)

    def unassign(self, worker: str, rid: str, stop_chars: int, *, after_pending: bool = False) -> None:
        """`rid` left `worker`: its stop strings' room is free at once, or (after_pending: its abort item is still to
        be sent) once the worker's pending items are sent (`pending_sent`)."""
        info = self.workers.get(worker)
        if info is not None:
            info.rids.discard(rid)
            if after_pending:
                info.stop_chars_ending += stop_chars
            else:
                info.stop_chars -= stop_chars

    def pending_sent(self, worker: str) -> None:
        if (info := self.workers.get(worker)) is not None:
            info.stop_chars -= info.stop_chars_ending
            info.stop_chars_ending = 0

    def hello(self, worker: str, pid: int, now: float) -> WorkerInfo | None:
        """Register a (re)started worker; returns its previous incarnation, whose rids are lost."""
        lost = self.workers.pop(worker, None)
        self.workers[worker] = WorkerInfo(worker, pid, now)
        return lost

    def heartbeat(self, worker: str, load: int, now: float, step: int = -1, blocked: bool = False) -> bool:
        """False when an unregistered worker still holds rids (see Scheduler.heartbeat); one without joins."""
        info = self.workers.get(worker)
        if info is not None:
            info.last_seen = now
            info.stalled_s = info.starved_s = 0.0
            if blocked or step >= info.sent_step:
                info.waiting_since = None
            elif step > info.answered_step:
                info.waiting_since = now  # progress: it owes less than before
            info.answered_step = max(info.answered_step, step)
            return True
        if load > 0:
            return False
        self.workers[worker] = WorkerInfo(worker, -1, now)
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

    def excuse_stall(self, seconds: float) -> None:
        """The engine's loop could not read the workers for `seconds` (it did not get to run): no worker's silence
        counts that long."""
        for info in self.workers.values():
            info.stalled_s += seconds

    def excuse_starved(self, worker: str, seconds: float) -> None:
        """`worker` waited `seconds` for a CPU since its last heartbeat (a total, not an increment): runnable but not
        run, it could not send; its silence does not count that long."""
        if (info := self.workers.get(worker)) is not None:
            info.starved_s = max(info.starved_s, seconds)

    def _heartbeat_deadline(self, info: WorkerInfo) -> float:
        return info.last_seen + self.heartbeat_timeout_s + info.stalled_s + info.starved_s

    def _answer_deadline(self, info: WorkerInfo) -> float | None:
        if self.answer_timeout_s <= 0 or info.waiting_since is None:
            return None  # not checked, or it owes no answer
        return info.waiting_since + self.answer_timeout_s

    def next_deadline(self) -> float | None:
        """The earliest time at which `silent` or `unresponsive` could name a worker, given no news meanwhile (None:
        no worker to judge). An idle engine waits for it instead of checking liveness on a fixed tick."""
        deadlines = [self._heartbeat_deadline(info) for info in self.workers.values()]
        deadlines += [d for info in self.workers.values() if (d := self._answer_deadline(info)) is not None]
        return min(deadlines, default=None)

    def overdue(self, now: float) -> list[WorkerInfo]:
        """Workers past their heartbeat deadline: whose CPU wait the caller may measure (`excuse_starved`) before
        asking `silent`."""
        return [info for info in self.workers.values() if now > self._heartbeat_deadline(info)]

    def silent(self, now: float) -> list[str]:
        """Workers without a heartbeat for longer than the timeout, excused time apart (still registered: the caller
        removes them)."""
        return [w for w, info in self.workers.items() if now > self._heartbeat_deadline(info)]

    def unresponsive(self, now: float) -> list[str]:
        """Workers that heartbeat but have handled none of their TokenBatches for longer than answer_timeout_s."""
        return [w for w, info in self.workers.items() if (d := self._answer_deadline(info)) is not None and now > d]
