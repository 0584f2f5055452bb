"""The engine's Scheduler stepped by unit tests: one with test defaults, a step (planned, then committed as if every
worker took its batch), and what a step's batches carry."""

from __future__ import annotations

from detok_worker.bus.columns import token_items
from detok_worker.bus.messages import Tokens
from detok_worker.engine.scheduler import Scheduler, StepPlan

EOS = 99


def new_scheduler(**options: object) -> Scheduler:
    defaults: dict[str, object] = {"max_batch": 8, "tokens_per_step": 1, "heartbeat_timeout_s": 1.0, "eos_ids": [EOS]}
    return Scheduler(**{**defaults, **options})  # type: ignore[arg-type]


def step(scheduler: Scheduler, now: float = 0.0, *, commit: bool = True) -> StepPlan:
    plan = scheduler.plan_step(now, int(now * 1e9), 123)
    if commit:
        for worker_plan in plan.workers:
            scheduler.commit(worker_plan)
    return plan


def items(plan: StepPlan) -> dict[str, list[Tokens]]:
    return {p.worker: list(token_items(p.batch)) for p in plan.workers}


def sent(plan: StepPlan) -> dict[str, list[int]]:
    """rid -> the ids the step's batches carry for it."""
    return {item.rid: item.ids for worker_plan in plan.workers for item in token_items(worker_plan.batch)}
