"""The scheduler as a relay for engines that schedule themselves (pushed requests: no admission cap of ours), and
the workers' stop-string budget checked where a request is placed, so a request that cannot fit is refused before
any output (a Reject with a kind the front turns into a status)."""

from __future__ import annotations

from helpers.bus_rows import token_rows
from helpers.scheduler_steps import new_scheduler, new_stub_scheduler, sent, step

from detok_worker.bus.messages import REJECT_INVALID, REJECT_STOP_BUDGET, DetokParams, RequestParams, Tokens


def _stops(chars: int) -> RequestParams:
    return RequestParams(max_tokens=100, detok=DetokParams(stop=["x" * chars]))


def test_pushed_requests_all_run_at_once():
    scheduler = new_scheduler()
    scheduler.hello("w1", 1, 0.0)
    for index in range(5):
        assert scheduler.submit(f"p{index}", [1], RequestParams(max_tokens=10)) is None
        assert scheduler.push(f"p{index}", [10 + index])
    plan = step(scheduler)
    assert [open_.rid for open_ in plan.workers[0].batch.opens] == [f"p{i}" for i in range(5)]
    assert sent(plan) == {f"p{i}": [10 + i] for i in range(5)}
    assert scheduler.live_rids == 5


def test_a_pushed_request_is_sent_what_came_since_its_last_step_and_nothing_when_nothing_came():
    scheduler = new_scheduler()
    scheduler.hello("w1", 1, 0.0)
    for rid in ("a", "b"):
        scheduler.submit(rid, [1], RequestParams(max_tokens=10))
    assert step(scheduler).workers == []  # an Open waits for its rid's first ids: one wakeup of the worker for both
    scheduler.push("a", [5, 6])
    assert sent(step(scheduler, commit=False)) == {"a": [5, 6]}  # the worker's queue was full: planned again
    scheduler.push("a", [7])
    first = step(scheduler)
    assert [open_.rid for open_ in first.workers[0].batch.opens] == ["a"]
    assert sent(first) == {"a": [5, 6, 7]}
    assert step(scheduler).workers == []
    scheduler.push("b", [8], "stop")
    scheduler.push("a", [9])
    assert sent(step(scheduler)) == {"a": [9], "b": [8]}
    assert scheduler.live_rids == 1


def test_a_request_no_worker_has_room_for_is_refused_at_submit_with_a_kind():
    scheduler = new_scheduler(max_live_stop_chars=100)
    scheduler.hello("w1", 1, 0.0)
    scheduler.hello("w2", 2, 0.0)
    assert scheduler.submit("a", [1], _stops(60)) is None
    assert scheduler.submit("b", [1], _stops(60)) is None
    refused = scheduler.submit("c", [1], _stops(60))
    assert refused is not None and (refused.rid, refused.kind) == ("c", REJECT_STOP_BUDGET)
    assert "worker.max_live_stop_chars = 100" in refused.error and refused.param is None
    assert scheduler.submit("plain", [1], RequestParams(max_tokens=10)) is None  # no stop strings
    assert scheduler.submit("small", [1], _stops(40)) is None  # 60 + 40 fits
    never = scheduler.submit("huge", [1], _stops(101))  # more than any worker holds
    assert never is not None and never.kind == REJECT_INVALID
    assert not scheduler.has_rid("c") and not scheduler.has_rid("huge") and scheduler.live_rids == 4
    step(scheduler)
    scheduler.push("a", [5], "stop")  # a ends: its room is free once its last ids are sent
    assert scheduler.submit("c", [1], _stops(60)) is not None
    step(scheduler)
    assert scheduler.submit("c", [1], _stops(60)) is None


def test_an_aborted_request_keeps_its_room_until_its_worker_has_the_abort():
    """A batch's Opens come before its items: a new Open sent with the abort item would find the room still taken."""
    scheduler = new_scheduler(max_live_stop_chars=100)
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("a", [1], _stops(60))
    scheduler.push("a", [5])
    step(scheduler)  # its Open and first id
    assert scheduler.abort("a")
    assert scheduler.submit("b", [1], _stops(60)) is not None
    assert sent(step(scheduler)) == {"a": []}  # the abort item goes out
    assert scheduler.submit("b", [1], _stops(60)) is None
    assert scheduler.finish("b", "w1")  # a worker's stop: it freed the rid before its Finish
    assert scheduler.submit("c", [1], _stops(60)) is None


def test_the_stubs_requests_are_refused_at_submit_and_re_opens_never():
    scheduler = new_stub_scheduler(max_live_stop_chars=100)
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("a", [1], _stops(70), [5, 6, 7])
    assert scheduler.submit("b", [1], _stops(70), [5, 6, 7]).kind == REJECT_STOP_BUDGET
    plan = step(scheduler)
    assert plan.rejects == []
    assert sent(plan) == {"a": [5]}
    scheduler.hello("w2", 2, 0.0)
    scheduler.submit("c", [1], _stops(70), [5, 6, 7])
    assert sent(step(scheduler)) == {"a": [6], "c": [5]}
    scheduler.goodbye("w1")  # a's output reached its client already: it goes to w2 whatever w2 holds
    plan = step(scheduler)
    assert plan.rejects == [] and plan.workers[0].worker == "w2"
    assert sent(plan) == {"a": [5, 6, 7], "c": [6]}
    assert token_rows(plan.workers[0].batch)[0] == ("a", Tokens([5, 6, 7], "stop"))


def test_push_all_takes_a_whole_engine_step_and_names_the_rids_that_no_longer_generate():
    scheduler = new_scheduler()
    scheduler.hello("w1", 1, 0.0)
    for rid in ("a", "b"):
        scheduler.submit(rid, [1], RequestParams(max_tokens=3))
    assert not scheduler.all_sent()  # both wait to be placed
    step(scheduler)
    assert scheduler.all_sent()
    assert scheduler.push_all([("a", [5, 6], None, None), ("b", [7], "stop", None), ("gone", [8], None, None)]) == [
        "gone"
    ]
    assert scheduler.generated == 4 and scheduler.backlog("a") == 2
    plan = step(scheduler, commit=False)  # a full worker queue: the ids stay back
    assert sent(plan) == {"a": [5, 6], "b": [7]} and not scheduler.all_sent()
    step(scheduler)
    assert scheduler.all_sent() and scheduler.backlog("a") == 0
    assert scheduler.push_all([("a", [9, 10], None, None), ("b", [1], None, None)]) == ["b"]  # b ended
    assert sent(step(scheduler)) == {"a": [9]}  # past max_tokens: cut, and it ends
    assert scheduler.live_rids == 0
