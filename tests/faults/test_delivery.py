"""The engine keeps an ended request until the front confirms its final text (Delivered): a worker that dies with
the final text still in its queues must not cost the client its last characters (the kill test found this: rids
whose last ids had been sent hung at the front after a SIGKILL)."""

from __future__ import annotations

from helpers.bus_rows import token_rows
from helpers.scheduler_steps import EOS, StubScheduler, items, new_stub_scheduler, step

from detok_worker.bus.messages import FINISH_ABORT, RequestParams, Tokens
from detok_worker.engine.scheduler import DELIVERY_GRACE_S


def scheduler_with(*workers: str) -> StubScheduler:
    scheduler = new_stub_scheduler(tokens_per_step=2)
    for worker in workers:
        scheduler.hello(worker, 1, 0.0)
    return scheduler


def test_ended_rid_is_reopened_with_its_finish_when_its_worker_dies_before_delivery() -> None:
    scheduler = scheduler_with("w1")
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7, EOS])
    step(scheduler)
    assert items(step(scheduler)) == {"w1": [("r1", Tokens([7, EOS], "stop"))]}  # the last ids left for w1
    assert scheduler.live_rids == 0 and not scheduler.has_work()
    scheduler.hello("w2", 2, 0.1)
    scheduler.goodbye("w1")  # w1 leaves before the front has the final text
    plan = step(scheduler, 0.2)
    assert [o.rid for o in plan.workers[0].batch.opens] == ["r1"]
    assert items(plan) == {"w2": [("r1", Tokens([5, 6, 7, EOS], "stop"))]}  # whole history and the same finish
    assert scheduler.reopened == 1
    assert scheduler.delivered("r1")
    scheduler.goodbye("w2")
    assert step(scheduler, 0.3).workers == [] and scheduler.live_rids == 0  # delivered: nothing to redo


def test_rid_stopped_by_its_worker_is_reopened_up_to_where_it_stopped() -> None:
    scheduler = scheduler_with("w1", "w2")
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7, 8, 9, 10, EOS])
    owner = next(iter(items(step(scheduler))))
    step(scheduler)
    assert scheduler.finish("r1", owner)  # a stop string ended at the 4th id
    scheduler.worker_unreachable(owner)
    (worker_plan,) = step(scheduler).workers
    assert worker_plan.worker != owner
    assert token_rows(worker_plan.batch) == [("r1", Tokens([5, 6, 7, 8], "stop"))]


def test_delivered_after_a_reopen_stops_the_rerun_without_counting_an_abort() -> None:
    scheduler = scheduler_with("w1")
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, EOS])
    step(scheduler)
    scheduler.hello("w1", 2, 0.1)  # restarted: the ended rid is re-opened on the new process
    step(scheduler, 0.1)
    scheduler.submit("r2", [1], RequestParams(max_tokens=50), [5, 6, 7, 8, 9, EOS])
    step(scheduler, 0.2)
    assert scheduler.delivered("r1")
    assert scheduler.aborted == 0
    assert scheduler.delivered("r2")  # a front that has all of r2 (never happens early for us) stops it too
    plan = step(scheduler, 0.3)
    assert items(plan) == {"w1": [("r2", Tokens([], FINISH_ABORT))]}
    assert scheduler.aborted == 0 and scheduler.live_rids == 0


def test_undelivered_rids_are_forgotten_after_the_grace_period() -> None:
    scheduler = scheduler_with("w1")
    for i in range(3):
        scheduler.submit(f"r{i}", [1], RequestParams(max_tokens=50), [5, EOS])
    step(scheduler)
    assert scheduler.delivering.rids("w1") == {"r0", "r1", "r2"}
    assert scheduler.delivered("r1") and not scheduler.delivered("r1")
    scheduler.heartbeat("w1", 0, DELIVERY_GRACE_S + 1)
    assert scheduler.expire_workers(DELIVERY_GRACE_S + 1) == []
    assert len(scheduler.delivering) == 0 and scheduler.delivering.rids("w1") == set()


def test_abort_and_a_reused_rid_drop_the_delivery_record() -> None:
    scheduler = scheduler_with("w1")
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, EOS])
    scheduler.submit("r2", [1], RequestParams(max_tokens=50), [5, EOS])
    step(scheduler)
    assert not scheduler.abort("r1")  # ended already: nothing to stop, but nothing kept either
    scheduler.submit("r2", [1], RequestParams(max_tokens=50), [7, EOS])  # the rid is reused
    assert "r1" not in scheduler.delivering and "r2" not in scheduler.delivering
    scheduler.hello("w1", 2, 0.1)
    assert items(step(scheduler, 0.1)) == {"w1": [("r2", Tokens([7, EOS], "stop"))]}


def test_a_request_arriving_while_no_worker_is_alive_waits_for_one() -> None:
    scheduler = scheduler_with()  # e.g. the only worker is restarting
    assert scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, EOS]) is None
    assert step(scheduler, 0.0).workers == []
    scheduler.hello("w1", 1, 1.0)
    assert items(step(scheduler, 1.0)) == {"w1": [("r1", Tokens([5, EOS], "stop"))]}
