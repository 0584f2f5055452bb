"""The engine's Scheduler stepped by unit tests: one with test defaults, a step (planned, then committed as if every
worker took its batch), and what a step's batches carry. `new_stub_scheduler` feeds it the way engine_stub's loop
does: a request's planned ids go to a PlannedEngine, whose steps push them into the Scheduler."""

from __future__ import annotations

from detok_worker.bus.columns import TokenRow
from detok_worker.bus.messages import FINISH_ABORT, Reject, RequestParams, TokenLogprob
from detok_worker.engine.scheduler import Scheduler, StepPlan
from engine_stub.planned import PlannedEngine
from helpers.bus_rows import token_rows

EOS = 99


def new_scheduler(**options: object) -> Scheduler:
    defaults: dict[str, object] = {"heartbeat_timeout_s": 1.0, "eos_ids": [EOS]}
    return Scheduler(**{**defaults, **options})  # type: ignore[arg-type]


class StubScheduler(Scheduler):
    """A Scheduler with engine_stub's PlannedEngine in front, as the stub's loop drives the EngineLink: `submit`
    accepts and plans, every `step` first pushes the engine's ids, and a request that stops leaves the engine."""

    def __init__(self, *, max_batch: int = 8, tokens_per_step: int = 1, **options: object) -> None:
        super().__init__(**{"heartbeat_timeout_s": 1.0, "eos_ids": [EOS], **options})  # type: ignore[arg-type]
        self.engine = PlannedEngine(max_batch, tokens_per_step)

    def submit(  # type: ignore[override]
        self,
        rid: str,
        prompt_ids: list[int],
        params: RequestParams,
        planned: list[int],
        release_ns: list[int] | None = None,
        finish: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> Reject | None:
        reject = super().submit(rid, prompt_ids, params)
        if reject is None:
            self.engine.add(rid, planned, params.max_tokens, finish=finish, release_ns=release_ns, logprobs=logprobs)
        return reject

    def push_step(self, now_ns: int) -> None:
        """The engine's step: its new ids pushed (a rid that no longer generates leaves it)."""
        for rid in self.push_all(self.engine.step(now_ns, None if self.all_sent() else self.backlog)):
            self.engine.cancel(rid)

    def drop(self, rid: str, finish: str = FINISH_ABORT, error: str | None = None) -> bool:
        self.engine.cancel(rid)
        return super().drop(rid, finish, error)

    def finish(self, rid: str, worker: str) -> bool:
        finished = super().finish(rid, worker)
        if finished:
            self.engine.cancel(rid)
        return finished

    def next_release_ns(self) -> int | None:
        return self.engine.next_release_ns()


def new_stub_scheduler(**options: object) -> StubScheduler:
    return StubScheduler(**options)  # type: ignore[arg-type]


def step(scheduler: Scheduler, now: float = 0.0, *, commit: bool = True) -> StepPlan:
    if isinstance(scheduler, StubScheduler):
        scheduler.push_step(int(now * 1e9))
    plan = scheduler.plan_step(now, 123)
    if commit:
        for worker_plan in plan.workers:
            scheduler.commit(worker_plan)
    return plan


def items(plan: StepPlan) -> dict[str, list[TokenRow]]:
    return {p.worker: list(token_rows(p.batch)) for p in plan.workers}


def sent(plan: StepPlan) -> dict[str, list[int]]:
    """rid -> the ids the step's batches carry for it."""
    return {rid: item.ids for worker_plan in plan.workers for rid, item in token_rows(worker_plan.batch)}
