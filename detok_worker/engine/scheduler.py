"""The engine's scheduling state, pure (no sockets, the caller passes the clock).

A request's ids are pushed as its engine generates them (`submit` + `push`): it runs from its submit on, as the
engine that schedules it decides (a cap of ours would only hold requests that engine could run). Each step takes
the ids pushed since the last one of the requests `_touched` meanwhile (so a step costs what changed, not what
runs), with their logprobs when the request asked, and builds one TokenBatch per worker. A request's Open goes
with its first ids (or its end), not at its submit: a relay's first ids come a step later, and a batch of Opens
alone would wake the worker for nothing; a request aborted before any ids never reaches a worker.
A step is only *planned* by `plan_step`; the caller sends each worker's batch and then `commit`s it, so a batch a
worker could not take (its queue is full) is simply planned again next step: the engine never blocks on a slow
worker, that worker's requests just pause.

Ownership: a request goes to the live worker with the fewest requests among those with room for its stop strings
(workers.py) when it starts and stays there (a new request none has room for is refused then, before any output);
when a worker dies (timeout, unreachable, Goodbye, a restart's Hello) its requests are re-opened on a live worker:
Open again, and a row with the full history.
Delivery: an ended request is kept, with its history, until the front reports `Delivered`; if its worker is lost
meanwhile, it is re-opened like a live one, its row carrying the finish too (why: `Undelivered`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from detok_worker.bus.columns import TokenRow
from detok_worker.bus.messages import (
    FINISH_ABORT,
    FINISH_LENGTH,
    REJECT_INVALID,
    REJECT_NO_WORKER,
    DetokParams,
    Open,
    Reject,
    RequestParams,
    TokenLogprob,
    Tokens,
)
from detok_worker.engine.plans import (
    NO_SUBMIT_LIMITS,
    Emitted,
    Groups,
    Request,
    StepPlan,
    SubmitLimits,
    Undelivered,
    WorkerGroup,
    WorkerPlan,
    aligned_logprobs,
    new_request,
    prompt_tail,
    worker_plans,
)
from detok_worker.engine.workers import WorkerInfo, WorkerRegistry
from detok_worker.errors import ParameterError
from detok_worker.stream.stop.rules import DEFAULT_STOP_LIMITS, StopLimits, StopRules

ORPHAN_GRACE_S = 5.0  # a request whose worker died waits this long for a live worker before it is rejected
# A request whose workers keep dying while they hold it may be what kills them (an id or output that crashes or hangs
# a worker where no guard of the worker's own can end it): after this many it fails, so it cannot take down the rest
MAX_WORKERS_LOST = 3
DELIVERY_GRACE_S = 30.0  # an ended request is kept this long for the front's Delivered (a front may never send it)

# one request's news of an engine step: (rid, new ids, finish or None, their logprobs or None)
Output = tuple[str, list[int], str | None, list[TokenLogprob] | None]

BAD_DUPLICATE_RID = "duplicate_rid"
BAD_STRAY_FINISH = "stray_finish"  # Finish for a rid the sender does not own (late, after a re-open)


class Scheduler:
    def __init__(
        self,
        *,
        heartbeat_timeout_s: float,
        answer_timeout_s: float = 0.0,
        stop_limits: StopLimits = DEFAULT_STOP_LIMITS,
        eos_ids: Iterable[int] = (),
        special_ids: Iterable[int] = (),
        limits: SubmitLimits = NO_SUBMIT_LIMITS,
        vocab_size: int = 0,
        max_live_stop_chars: int | None = None,
    ) -> None:
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.eos_ids = frozenset(eos_ids)
        self.special_ids = frozenset(special_ids)
        self.stop_limits = stop_limits
        self.limits = limits
        self.vocab_size = vocab_size  # the model's vocabulary size, on every Open (0: not known)
        self.registry = WorkerRegistry(heartbeat_timeout_s, answer_timeout_s, max_live_stop_chars)
        self.running: dict[str, Request] = {}
        self._touched: dict[str, Request] = {}  # running requests the next step looks at (see the module doc)
        self._to_assign: list[Request] = []  # new or orphaned requests without a worker
        self._pending: dict[str, list[TokenRow]] = {}  # worker -> abort rows to deliver
        self._uncommitted = 0  # batches of the last step not committed (their worker's queue was full)
        self.delivering: Undelivered[Request] = Undelivered(DELIVERY_GRACE_S)
        self._now = 0.0  # the caller's clock as of the last plan_step/expire_workers
        self.step_number = 0
        self.bad: Counter[str] = Counter()
        self.aborted = 0
        self.reopened = 0
        # workers declared lost: silent past their timeout, batches unanswered, unreachable, or restarted (a Hello
        # from a new process while registered); a worker that says Goodbye leaves without counting
        self.lost_workers = 0
        self.generated = 0  # ids pushed, whether or not their request still generates

    # ---- requests -------------------------------------------------------------------------------------

    @property
    def live_rids(self) -> int:
        return len(self.running)

    def has_rid(self, rid: str, *, generating: bool = False) -> bool:  # generating: the engine still makes its ids
        request = self.running.get(rid)
        return request is not None and (not generating or request.open_ended)

    def list_live_rids(self) -> list[str]:
        return list(self.running)

    def submit(self, rid: str, prompt_ids: list[int], params: RequestParams) -> Reject | None:
        """Take a request whose output ids come by `push`. Returns a Reject when it cannot be taken; a duplicate live
        rid is ignored."""
        if self.has_rid(rid):
            self.bad[BAD_DUPLICATE_RID] += 1
            return None
        self.delivering.forget(rid)
        if (problem := self.limits.check(prompt_ids, params)) is not None:
            return Reject(rid, problem, kind=REJECT_INVALID)
        try:
            rules = StopRules.from_params(params.detok, self.stop_limits, self.eos_ids, ignore_eos=params.ignore_eos)
        except ParameterError as exc:
            return Reject(rid, str(exc), kind=REJECT_INVALID)
        tail = prompt_tail(prompt_ids, self.special_ids)
        request = new_request(rid, tail, params, rules)
        # the engine schedules it: it runs now, on a worker with room for its stop strings, or is refused now
        self.running[rid] = request
        self._to_assign.append(request)
        return self._place(request, self._now) if self.registry else None

    def push(
        self, rid: str, ids: list[int], finish: str | None = None, logprobs: list[TokenLogprob] | None = None
    ) -> bool:
        """New ids of a request; `finish` (stop, length, abort, error) ends it. Ids past max_tokens are
        dropped and end it with "length". False when the rid is not generating (ended, stopped by a worker,
        aborted, unknown): the engine should stop generating it. `logprobs`: one per id."""
        return not self.push_all(((rid, ids, finish, logprobs),))

    def push_all(self, outputs: Iterable[Output]) -> list[str]:
        """`push` of one engine step's outputs, (rid, ids, finish, logprobs) each; returns the rids that are not
        generating."""
        running, touched = self.running, self._touched
        gone: list[str] = []
        generated = 0
        for rid, ids, finish, logprobs in outputs:
            count = len(ids)
            generated += count
            request = running.get(rid)
            if request is None or not request.open_ended:
                gone.append(rid)
                continue
            kept = request.ids
            room = request.max_tokens - len(kept)
            if count > room:  # ids past max_tokens are dropped, and end it
                ids, count, finish = ids[:room], room, FINISH_LENGTH
            kept += ids
            if request.logprobs is not None:
                request.logprobs += aligned_logprobs(logprobs, count)
            if finish is not None:
                request.finish = finish
                request.open_ended = False
            touched[rid] = request
        self.generated += generated
        return gone

    def detok_params(self, rid: str) -> DetokParams | None:
        """The DetokParams a live rid's worker gets (EOS ids added unless ignore_eos)."""
        request = self.running.get(rid)
        return None if request is None else request.detok

    def backlog(self, rid: str) -> int:
        """Ids of a request not yet sent to its worker (they pile up while the worker's queue is full)."""
        request = self.running.get(rid)
        return 0 if request is None else len(request.ids) - request.cursor

    def all_sent(self) -> bool:
        """Every id pushed before the last step went to its worker (`backlog` is 0 for every rid until the next
        push): each batch of that step was committed, and no request waits for a worker."""
        return not self._uncommitted and not self._to_assign

    def abort(self, rid: str) -> bool:
        """Stop generating `rid`; its worker gets a row (rid, Tokens([], finish="abort")) to free its state."""
        if self.drop(rid):
            self.aborted += 1
            return True
        return False

    def drop(self, rid: str, finish: str = FINISH_ABORT, error: str | None = None) -> bool:
        """Forget `rid` wherever it is (its worker frees it on a row (rid, Tokens([], finish, error))), not an abort."""
        self.delivering.forget(rid)
        return self._stop(rid, finish, error)

    def finish(self, rid: str, worker: str) -> bool:
        """A worker found a stop (or a bad id) in `rid`: stop generating it. Only the owner's Finish counts."""
        request = self.running.get(rid)
        if request is None:
            return False
        if request.worker != worker:
            self.bad[BAD_STRAY_FINISH] += 1
            return False
        del self.running[rid]
        self._unassign(request)
        request.stop_at_cursor()
        self._hold(request)
        return True

    def delivered(self, rid: str) -> bool:
        """The front has the rid's final text: forget it. A rid that was re-opened meanwhile (its worker died
        after the final text left it) is stopped on its new worker, without counting as an abort."""
        return self.delivering.forget(rid) or self._stop(rid)

    # ---- workers --------------------------------------------------------------------------------------

    def live_workers(self) -> list[str]:
        return self.registry.names()

    def hello(self, worker: str, pid: int, now: float) -> None:
        """A worker (re)started: whatever it had is gone, so its requests are re-opened."""
        if (lost := self.registry.hello(worker, pid, now)) is not None:
            restarted = lost.pid != pid  # a new process (a rejoin, after the engine declared it lost, keeps its pid)
            self.lost_workers += restarted
            self._reopen(lost, restarted)

    def heartbeat(self, worker: str, load: int, now: float, step: int = -1, blocked: bool = False) -> bool:
        """False for an unregistered worker holding requests (stale: it must rejoin empty); one without joins."""
        return self.registry.heartbeat(worker, load, now, step, blocked)

    def goodbye(self, worker: str) -> None:
        self._lose_worker(worker, lost=False)

    def worker_unreachable(self, worker: str) -> None:
        if self._lose_worker(worker):
            self.lost_workers += 1

    def expire_workers(self, now: float) -> list[str]:
        """Declare workers without a recent heartbeat, or without progress on their batches, dead; their
        requests are re-opened."""
        self._now = now
        dead = list(dict.fromkeys(self.registry.silent(now) + self.registry.unresponsive(now)))
        for worker in dead:
            self._lose_worker(worker)
        self.lost_workers += len(dead)
        self.delivering.expire(now)
        return dead

    def worker_loads(self) -> dict[str, int]:
        return self.registry.loads()

    # ---- steps ----------------------------------------------------------------------------------------

    def plan_step(self, now: float, sent_ns: int) -> StepPlan:
        """Next ids of every generating request, grouped into one TokenBatch per worker (not yet committed).
        now: monotonic clock (liveness); sent_ns: wall clock stamped on the batches."""
        self._now = now
        rejects = self._assign(now)
        groups: Groups = {}
        running, touched = self.running, self._touched
        untouched: list[str] = []
        group_worker, opens, rows, advances = None, [], [], []  # the group of the last request's worker
        for rid, request in touched.items():
            worker = request.worker
            if running.get(rid) is not request or worker is None:
                untouched.append(rid)  # ended, or waiting for a worker (placing it touches it again)
                continue
            cursor, ids = request.cursor, request.ids
            end, ends = len(ids), not request.open_ended
            if end == cursor and not ends:
                # all sent, or nothing yet: its next push touches it again. An Open waits for the rid's first ids
                # (a relay's come a step after the Submit), so the worker wakes once for both
                untouched.append(rid)
                continue
            if worker is not group_worker:
                group = groups.get(worker)
                if group is None:
                    group = groups[worker] = WorkerGroup([], [], [])
                group_worker, (opens, rows, advances) = worker, group
            if not request.opened:
                opens.append(Open(rid, request.prompt_tail, request.detok, vocab_size=self.vocab_size))
                cursor = 0  # a (re-)open carries the full history
            logprobs = None if request.logprobs is None else request.logprobs[cursor:end]
            rows.append((rid, Tokens(ids[cursor:end], request.finish if ends else None, None, logprobs)))
            advances.append((request, end, ends))
        for rid in untouched:
            del touched[rid]
        self.step_number += 1
        plans = worker_plans(self.step_number, sent_ns, groups, self._pending, self.registry)
        self._uncommitted = len(plans)
        return StepPlan(plans, rejects)

    def commit(self, plan: WorkerPlan, *, report: bool = False) -> list[Emitted]:
        """The worker's batch was sent: advance its requests, end the finished ones. With report, returns the
        newly emitted ids per rid (for recording)."""
        emitted: list[Emitted] = []
        self._uncommitted -= 1
        self.registry.sent(plan.worker, plan.batch.step, self._now)
        pending = self._pending.get(plan.worker)
        if pending is not None:
            del pending[: len(plan.extra)]
            if not pending:
                del self._pending[plan.worker]
                self.registry.pending_sent(plan.worker)
        running, worker = self.running, plan.worker
        for request, end, ends in plan.advances:
            if running.get(request.rid) is not request or request.worker != worker:
                continue  # ended or moved while the batch was in flight
            if report and not request.ended and (end > request.cursor or ends):
                emitted.append(
                    Emitted(request.rid, request.ids[request.cursor : end], request.finish if ends else None)
                )
            request.cursor = end
            request.opened = True
            if ends:
                del running[request.rid]
                self._unassign(request)
                self._hold(request)
        return emitted

    def has_work(self) -> bool:
        return bool(self.running or self._pending)

    # ---- internals ------------------------------------------------------------------------------------

    def _assign(self, now: float) -> list[Reject]:
        rejects: list[Reject] = []
        if not self._to_assign:
            return rejects
        waiting: list[Request] = []
        for request in self._to_assign:
            if self.running.get(request.rid) is not request or request.worker is not None:
                continue  # ended (abort, Finish) or already placed
            if (reject := self._place(request, now)) is not None:
                rejects.append(reject)
            elif request.worker is None:
                waiting.append(request)
        self._to_assign = waiting
        return rejects

    def _place(self, request: Request, now: float) -> Reject | None:
        """A worker for a running request. A new one no worker has room for is refused (before any output: its
        client gets a status); a re-opened one goes to the least loaded worker anyway (which refuses it if it must).
        With no live worker it waits, ORPHAN_GRACE_S at most."""
        registry = self.registry
        if request.workers_lost >= MAX_WORKERS_LOST:
            del self.running[request.rid]
            message = (
                f"{request.workers_lost} detok workers were lost while they held this request; it is ended so that"
                " it cannot take down more"
            )
            return Reject(request.rid, message)
        info = registry.place(request.rid, request.stop_chars, anywhere=request.placed)
        if info is not None:
            request.worker = info.worker
            request.opened = False
            request.orphan_since = None
            request.placed = True
            self._touched[request.rid] = request
            return None
        if registry:
            del self.running[request.rid]
            return registry.refusal(request.rid, request.stop_chars)
        if request.orphan_since is None:
            request.orphan_since = now
        elif now - request.orphan_since > ORPHAN_GRACE_S:
            del self.running[request.rid]
            return Reject(request.rid, "no detok worker is alive", kind=REJECT_NO_WORKER)
        return None

    def _unassign(self, request: Request, *, after_pending: bool = False) -> None:
        """The request leaves its worker (after_pending: with an abort item still to be sent to it)."""
        if request.worker is not None:
            self.registry.unassign(request.worker, request.rid, request.stop_chars, after_pending=after_pending)

    def _lose_worker(self, worker: str, lost: bool = True) -> bool:
        """False when `worker` was not registered; `lost`: it did not leave with a Goodbye."""
        if (info := self.registry.remove(worker)) is None:
            return False
        self._reopen(info, lost)
        return True

    def _reopen(self, info: WorkerInfo, lost: bool = True) -> None:
        worker = info.worker
        self._pending.pop(worker, None)
        for request in self.delivering.take_worker(worker):  # the final text may have died with the worker
            self.running[request.rid] = request
            info.rids.add(request.rid)
        for rid in info.rids:
            if (request := self.running.get(rid)) is not None:
                request.worker = None
                request.opened = False
                request.workers_lost += lost
                self._to_assign.append(request)
                self.reopened += 1

    def _stop(self, rid: str, finish: str = FINISH_ABORT, error: str | None = None) -> bool:
        request = self.running.pop(rid, None)
        if request is None:
            return False
        aborted_on_worker = request.worker is not None and request.opened
        if aborted_on_worker:
            self._pending.setdefault(request.worker, []).append((rid, Tokens([], finish, error)))
        self._unassign(request, after_pending=aborted_on_worker)
        return True

    def _hold(self, request: Request) -> None:
        """Keep an ended request until the front confirms its final text (see Delivery above)."""
        if request.worker is not None and request.worker in self.registry:
            request.ended = True
            self.delivering.hold(request.rid, request, request.worker, self._now)
