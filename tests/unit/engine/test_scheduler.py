"""The engine's pure scheduling state fed by engine_stub's PlannedEngine (as the stub's loop feeds it): batching,
routing, endings, re-opens, pacing."""

from __future__ import annotations

from helpers.bus_rows import token_rows
from helpers.scheduler_steps import EOS, new_scheduler
from helpers.scheduler_steps import items as _items
from helpers.scheduler_steps import new_stub_scheduler as _scheduler
from helpers.scheduler_steps import sent as _sent
from helpers.scheduler_steps import step as _step

from detok_worker.bus.messages import (
    REJECT_FAILED,
    DetokParams,
    Open,
    RequestParams,
    SamplingParams,
    TokenLogprob,
    Tokens,
)
from detok_worker.engine.plans import (
    MAX_PROMPT_TAIL,
    NO_LOGPROB,
    PROMPT_CONTEXT,
    PROMPT_TAIL,
    SubmitLimits,
    prompt_tail,
)
from detok_worker.engine.scheduler import (
    BAD_DUPLICATE_RID,
    BAD_STRAY_FINISH,
    ORPHAN_GRACE_S,
    Scheduler,
)


def _run_to_end(scheduler: Scheduler, rid: str, limit: int = 100) -> list[int]:
    ids: list[int] = []
    for _ in range(limit):
        for worker_plan in _step(scheduler).workers:
            for item_rid, item in token_rows(worker_plan.batch):
                if item_rid == rid:
                    ids.extend(item.ids)
                    if item.finish:
                        return ids
    raise AssertionError("did not finish")


def test_no_worker_rejects():
    scheduler = _scheduler()
    assert scheduler.submit("r1", [1], RequestParams(max_tokens=4), [5, 6]) is None  # waits for a worker ...
    assert _step(scheduler, 0.0).rejects == []
    (reject,) = _step(scheduler, ORPHAN_GRACE_S + 0.1).rejects  # ... ORPHAN_GRACE_S at most
    assert reject.rid == "r1" and "worker" in reject.error
    assert scheduler.live_rids == 0


def test_open_then_tokens_then_finish_stop_at_eos():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    prompt = list(range(100, 120))
    params = RequestParams(max_tokens=10, detok=DetokParams(stop=["x"], stop_token_ids=[7]))
    assert scheduler.submit("r1", prompt, params, [5, 6, EOS]) is None
    plan = _step(scheduler)
    (worker_plan,) = plan.workers
    assert worker_plan.worker == "w1"
    assert worker_plan.batch.sent_ns == 123
    (open_,) = worker_plan.batch.opens
    assert open_ == Open("r1", prompt[-PROMPT_TAIL:], DetokParams(stop=["x"], stop_token_ids=[7, EOS]))
    assert token_rows(worker_plan.batch) == [("r1", Tokens([5]))]
    assert _items(_step(scheduler)) == {"w1": [("r1", Tokens([6]))]}
    assert _items(_step(scheduler)) == {"w1": [("r1", Tokens([EOS], "stop"))]}
    assert _step(scheduler).workers == []
    assert scheduler.live_rids == 0
    assert scheduler.worker_loads() == {"w1": 0}


def test_ignore_eos_keeps_stop_ids_and_max_tokens_gives_length():
    scheduler = _scheduler(tokens_per_step=2)
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=3, ignore_eos=True), [5, 6, 7, 8, EOS])
    plan = _step(scheduler)
    assert plan.workers[0].batch.opens[0].params.stop_token_ids == []
    assert token_rows(plan.workers[0].batch) == [("r1", Tokens([5, 6]))]
    assert _items(_step(scheduler)) == {"w1": [("r1", Tokens([7], "length"))]}


def test_max_tokens_zero_ends_at_once():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=0), [5, EOS])
    plan = _step(scheduler)
    assert [o.rid for o in plan.workers[0].batch.opens] == ["r1"]
    assert token_rows(plan.workers[0].batch) == [("r1", Tokens([], "length"))]
    assert scheduler.live_rids == 0


def test_negative_max_tokens_and_duplicate_rid():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    assert scheduler.submit("bad", [1], RequestParams(max_tokens=-1), [1]) is not None
    assert scheduler.submit("r1", [1], RequestParams(max_tokens=5), [1]) is None
    assert scheduler.submit("r1", [1], RequestParams(max_tokens=5), [2]) is None
    assert scheduler.bad[BAD_DUPLICATE_RID] == 1
    assert scheduler.live_rids == 1


def test_continuous_batching_respects_max_batch():
    scheduler = _scheduler(max_batch=2)
    scheduler.hello("w1", 1, 0.0)
    for rid, length in (("a", 1), ("b", 3), ("c", 2)):
        scheduler.submit(rid, [1], RequestParams(max_tokens=50), list(range(length)))
    first = _step(scheduler)  # "c" waits for a slot; an Open goes with its rid's first ids ...
    assert [o.rid for o in first.workers[0].batch.opens] == ["a", "b"]
    assert _sent(first) == {"a": [0], "b": [0]}
    second = _step(scheduler)  # ... "a" ended in the first step, so "c" starts now
    assert [o.rid for o in second.workers[0].batch.opens] == ["c"]
    assert _sent(second) == {"b": [1], "c": [0]}
    assert _sent(_step(scheduler)) == {"b": [2], "c": [1]}


def test_least_load_routing_and_one_batch_per_worker():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.hello("w2", 2, 0.0)
    for i in range(6):
        scheduler.submit(f"r{i}", [1], RequestParams(max_tokens=50), [1, 2, 3])
    plan = _step(scheduler)
    assert sorted(p.worker for p in plan.workers) == ["w1", "w2"]
    assert scheduler.worker_loads() == {"w1": 3, "w2": 3}
    owners = {rid: p.worker for p in plan.workers for rid, _ in token_rows(p.batch)}
    for _ in range(2):  # a rid stays on its worker
        for p in _step(scheduler).workers:
            assert all(owners[rid] == p.worker for rid, _ in token_rows(p.batch))


def test_finish_from_owner_stops_generation_stray_finish_is_ignored():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), list(range(10)))
    _step(scheduler)
    assert not scheduler.finish("r1", "someone-else")
    assert scheduler.bad[BAD_STRAY_FINISH] == 1
    assert scheduler.finish("r1", "w1")
    assert _step(scheduler).workers == []
    assert scheduler.live_rids == 0 and scheduler.worker_loads() == {"w1": 0}
    assert not scheduler.finish("r1", "w1")  # late duplicate: harmless


def test_abort_sends_abort_item_to_the_owner_and_frees():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), list(range(10)))
    scheduler.submit("r2", [1], RequestParams(max_tokens=50), list(range(10)))
    _step(scheduler)
    assert scheduler.abort("r1")
    plan = _step(scheduler)
    batch = plan.workers[0].batch
    assert token_rows(batch) == [("r1", Tokens([], "abort")), ("r2", Tokens([1]))]  # the abort first
    assert (batch.ids, list(batch.extras)) == ([0, 1], [0])  # r2's id: a plain row
    assert _items(_step(scheduler)) == {"w1": [("r2", Tokens([2]))]}  # delivered once
    assert scheduler.aborted == 1 and scheduler.live_rids == 1
    assert not scheduler.abort("unknown")


def test_dropping_with_an_engine_error_tells_the_worker_why():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), list(range(10)))
    _step(scheduler)
    assert scheduler.drop("r1", "error", "engine lost")
    assert _items(_step(scheduler)) == {"w1": [("r1", Tokens([], "error", "engine lost"))]}
    assert scheduler.aborted == 0 and scheduler.live_rids == 0


def test_abort_of_a_waiting_request():
    scheduler = _scheduler(max_batch=1)
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [1, 2])
    scheduler.submit("r2", [1], RequestParams(max_tokens=50), [1, 2])
    _step(scheduler)
    assert scheduler.abort("r2")
    assert scheduler.live_rids == 1
    # r2 never generated (it waited for r1's slot): its worker never had its Open, so nothing goes there for it
    assert _items(_step(scheduler)) == {"w1": [("r1", Tokens([2], "stop"))]}
    assert not scheduler.engine.has_work()


def test_uncommitted_plan_is_planned_again():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1, 2], RequestParams(max_tokens=50), [5, 6, 7])
    first = _step(scheduler, commit=False)  # the worker's queue was full
    again = _step(scheduler, commit=False)
    assert first.workers[0].batch.opens == again.workers[0].batch.opens != []
    assert token_rows(first.workers[0].batch) == token_rows(again.workers[0].batch) == [("r1", Tokens([5]))]
    _step(scheduler)
    assert _items(_step(scheduler)) == {"w1": [("r1", Tokens([6]))]}


def test_dead_worker_rids_are_reopened_with_full_history():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1, 2, 3], RequestParams(max_tokens=50), [5, 6, 7, 8, EOS])
    _step(scheduler, 0.1)
    _step(scheduler, 0.2)
    scheduler.hello("w2", 2, 0.5)
    scheduler.heartbeat("w2", 0, 1.5)
    assert scheduler.expire_workers(1.5) == ["w1"]
    plan = _step(scheduler, 1.5)
    (worker_plan,) = plan.workers
    assert worker_plan.worker == "w2"
    assert [o.rid for o in worker_plan.batch.opens] == ["r1"]
    assert token_rows(worker_plan.batch) == [("r1", Tokens([5, 6, 7]))]  # history + this step's id
    assert scheduler.reopened == 1
    # the dead worker comes back still holding state: it must be told to go
    assert scheduler.heartbeat("w1", 1, 1.6) is False
    assert scheduler.heartbeat("w1", 0, 1.7) is True  # a fresh process with no state may rejoin


def test_hello_from_a_known_worker_means_it_restarted():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7])
    _step(scheduler)
    scheduler.hello("w1", 2, 0.1)
    plan = _step(scheduler, 0.1)
    assert [o.rid for o in plan.workers[0].batch.opens] == ["r1"]
    assert token_rows(plan.workers[0].batch) == [("r1", Tokens([5, 6]))]


def test_goodbye_and_unreachable_move_rids():
    scheduler = _scheduler()
    for worker in ("w1", "w2", "w3"):
        scheduler.hello(worker, 1, 0.0)
    for i in range(3):
        scheduler.submit(f"r{i}", [1], RequestParams(max_tokens=50), [5, 6, 7])
    _step(scheduler)
    scheduler.goodbye("w1")
    scheduler.worker_unreachable("w2")
    plan = _step(scheduler)
    assert [p.worker for p in plan.workers] == ["w3"]
    assert {o.rid for o in plan.workers[0].batch.opens} == {"r0", "r1"}
    assert scheduler.worker_loads() == {"w3": 3}


def test_a_request_whose_workers_keep_dying_fails_before_it_takes_down_more():
    """Each worker holding r1 is lost in turn (silent, unreachable, restarted); r2 moves too, but from a worker that
    said Goodbye. The third loss fails r1 with a Reject naming why; r2 goes on."""
    scheduler = _scheduler()
    for worker in ("w1", "w2", "w3", "w4", "w5"):
        scheduler.hello(worker, 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7, 8, 9, 10])
    losses = [
        lambda worker: scheduler.expire_workers(10.0) and None,
        scheduler.worker_unreachable,
        lambda worker: scheduler.hello(worker, 2, 0.0),
    ]
    holders = []
    for now, lose in enumerate(losses):
        (plan,) = _step(scheduler, float(now)).workers
        holders.append(plan.worker)
        for worker in ("w1", "w2", "w3", "w4", "w5"):
            if worker != plan.worker:
                scheduler.heartbeat(worker, 0, 10.0)
        lose(plan.worker)
        assert "r1" in scheduler.running or now == len(losses) - 1
    assert len(set(holders)) == 3
    rejects = scheduler.plan_step(3.0, 123).rejects
    assert [(reject.rid, reject.error, reject.kind) for reject in rejects] == [
        (
            "r1",
            "3 detok workers were lost while they held this request; it is ended so that it cannot take down more",
            REJECT_FAILED,
        )
    ]
    assert "r1" not in scheduler.running


def test_a_goodbye_is_not_a_lost_worker_for_its_requests():
    scheduler = _scheduler()
    for worker in ("w1", "w2", "w3", "w4"):
        scheduler.hello(worker, 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7, 8, 9, 10])
    for now in range(3):
        (plan,) = _step(scheduler, float(now)).workers
        scheduler.goodbye(plan.worker)
    (plan,) = _step(scheduler, 3.0).workers
    assert plan.batch.opens[0].rid == "r1" and not _step(scheduler, 3.0).rejects


def test_every_open_carries_the_models_vocabulary_size_re_opens_too():
    scheduler = _scheduler(vocab_size=151_936)
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7])
    (open_,) = _step(scheduler).workers[0].batch.opens
    assert open_.vocab_size == 151_936
    scheduler.hello("w2", 2, 0.0)
    scheduler.goodbye("w1")
    (open_,) = _step(scheduler).workers[0].batch.opens
    assert (open_.rid, open_.vocab_size) == ("r1", 151_936)
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7])
    assert _step(scheduler).workers[0].batch.opens[0].vocab_size == 0  # not known: the tokenizer's ids only


def test_orphans_wait_for_a_worker_then_are_rejected():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7])
    scheduler.submit("r2", [1], RequestParams(max_tokens=50), [5, 6, 7])
    _step(scheduler)
    scheduler.goodbye("w1")
    assert _step(scheduler, 1.0).rejects == []
    scheduler.hello("w2", 2, 1.5)
    plan = _step(scheduler, 2.0)  # a worker came back in time: r1 and r2 continue there
    assert {o.rid for o in plan.workers[0].batch.opens} == {"r1", "r2"}
    scheduler.goodbye("w2")
    assert _step(scheduler, 3.0).rejects == []
    rejects = _step(scheduler, 3.0 + ORPHAN_GRACE_S + 0.1).rejects
    assert sorted(r.rid for r in rejects) == ["r1", "r2"]
    assert scheduler.live_rids == 0


def test_paced_replay_releases_ids_at_their_times():
    scheduler = _scheduler(tokens_per_step=1)
    scheduler.hello("w1", 1, 0.0)
    ns = 1_000_000_000
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7, 8], release_ns=[ns, ns, 2 * ns, 3 * ns])
    assert _step(scheduler, 0.5).workers == []  # nothing due yet: the Open waits for the first ids
    assert scheduler.next_release_ns() == ns
    due = _step(scheduler, 1.0)
    assert [o.rid for o in due.workers[0].batch.opens] == ["r1"]
    assert _items(due) == {"w1": [("r1", Tokens([5, 6]))]}  # both due: pacing beats tokens_per_step
    assert _step(scheduler, 1.5).workers == []
    assert _items(_step(scheduler, 3.0)) == {"w1": [("r1", Tokens([7, 8], "stop"))]}


def test_recorded_finish_is_used_unless_truncated():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5], finish="abort")
    scheduler.submit("r2", [1], RequestParams(max_tokens=1), [5, 6], finish="stop")
    assert {rid: t.finish for rid, t in token_rows(_step(scheduler).workers[0].batch)} == {
        "r1": "abort",
        "r2": "length",
    }


def test_commit_reports_new_ids_only():
    scheduler = _scheduler(tokens_per_step=2)
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("r1", [1], RequestParams(max_tokens=50), [5, 6, 7, EOS])
    emitted = []
    for _ in range(3):
        scheduler.push_step(0)
        plan = scheduler.plan_step(0.0, 0)
        for worker_plan in plan.workers:
            emitted.extend(scheduler.commit(worker_plan, report=True))
        if _ == 0:
            scheduler.hello("w1", 2, 0.0)  # restart: next step re-sends history, commit reports only new ids
    assert [(e.ids, e.finish) for e in emitted] == [([5, 6], None), ([7, EOS], "stop")]


def test_unknown_worker_with_requests_is_refused_without_requests_joins():
    """After an engine restart a worker may still hold rids of the old engine: it must restart, not linger."""
    scheduler = _scheduler()
    assert scheduler.heartbeat("old", 3, 0.0) is False
    assert scheduler.live_workers() == []
    assert scheduler.heartbeat("fresh", 0, 0.0) is True
    assert scheduler.live_workers() == ["fresh"]


def test_prompt_tail_reaches_past_a_run_of_special_tokens() -> None:
    special = frozenset({9})
    plain = list(range(100, 200))
    assert prompt_tail(plain, special) == plain[-PROMPT_TAIL:]
    ended_by_specials = [*plain, *[9] * 300]
    tail = prompt_tail(ended_by_specials, special)
    assert tail[-300:] == [9] * 300 and tail[:-300][-PROMPT_CONTEXT:] == plain[-PROMPT_CONTEXT:]
    assert prompt_tail([*plain, *[9] * (MAX_PROMPT_TAIL + 5)], special) == [9] * MAX_PROMPT_TAIL
    assert prompt_tail(ended_by_specials, frozenset()) == [9] * PROMPT_TAIL


def test_a_worker_that_heartbeats_but_never_handles_its_batches_is_lost() -> None:
    scheduler = _scheduler(answer_timeout_s=5.0)
    scheduler.hello("stuck", 1, 0.0)
    scheduler.submit("r", [1, 2], RequestParams(max_tokens=3), [5, 6, 7])
    plan = _step(scheduler, 0.0)
    step = plan.workers[0].batch.step
    for now in (1.0, 3.0, 5.0):
        scheduler.heartbeat("stuck", 1, now)  # alive, but reports no step handled
        assert scheduler.expire_workers(now) == []
    scheduler.heartbeat("stuck", 1, 5.5)
    assert scheduler.expire_workers(5.5) == ["stuck"]
    scheduler.hello("healthy", 2, 5.5)
    reopened = _step(scheduler, 5.6)
    assert [o.rid for o in reopened.workers[0].batch.opens] == ["r"]
    # a worker that reports its steps, or says it is blocked on the front, is never lost for it
    scheduler.heartbeat("healthy", 1, 20.0, reopened.workers[0].batch.step)
    assert scheduler.expire_workers(20.0) == []
    _step(scheduler, 20.0)
    scheduler.heartbeat("healthy", 1, 40.0, step, blocked=True)
    assert scheduler.expire_workers(40.0) == []


def test_the_engine_checks_submit_limits() -> None:
    scheduler = _scheduler(limits=SubmitLimits(max_tokens=100, max_prompt_tokens=4))
    assert "max_tokens" in scheduler.submit("a", [1], RequestParams(max_tokens=2**40), []).error
    assert "the prompt has 5 tokens" in scheduler.submit("b", [1] * 5, RequestParams(max_tokens=1), []).error
    many_logprobs = RequestParams(max_tokens=1, sampling=SamplingParams(logprobs=10**9))
    assert "logprobs must be between 0 and 20" in scheduler.submit("d", [1], many_logprobs, []).error
    assert scheduler.submit("c", [1] * 4, RequestParams(max_tokens=100), []) is None
    assert scheduler.submit("e", [1], RequestParams(max_tokens=1, sampling=SamplingParams(logprobs=20)), []) is None


def _logprob(value: float) -> TokenLogprob:
    return TokenLogprob(value, [5], [value])


def test_logprobs_go_with_their_ids_and_with_a_reopen():
    scheduler = _scheduler()
    scheduler.hello("w1", 1, 0.0)
    params = RequestParams(max_tokens=3, sampling=SamplingParams(logprobs=1))
    entries = [_logprob(-0.1 * k) for k in range(5)]
    scheduler.submit("r1", [1], params, [5, 6, 7, 8, EOS], logprobs=entries)
    assert _items(_step(scheduler, 0.1)) == {"w1": [("r1", Tokens([5], None, None, entries[:1]))]}
    scheduler.hello("w1", 2, 0.2)  # restarted: the re-open carries the history's entries too
    assert _items(_step(scheduler, 0.2)) == {"w1": [("r1", Tokens([5, 6], None, None, entries[:2]))]}
    # max_tokens cuts the plan and its entries alike
    assert _items(_step(scheduler, 0.3)) == {"w1": [("r1", Tokens([7], "length", None, entries[2:3]))]}


def test_pushed_logprobs_only_when_asked_and_padded_when_missing():
    scheduler = new_scheduler()
    scheduler.hello("w1", 1, 0.0)
    scheduler.submit("asked", [1], RequestParams(max_tokens=3, sampling=SamplingParams(logprobs=0)))
    scheduler.submit("plain", [1], RequestParams(max_tokens=3))
    assert scheduler.push("asked", [5, 6], None, [_logprob(-1.0)])  # one entry short: padded
    assert scheduler.push("plain", [5], None, [_logprob(-1.0)])  # not asked: dropped
    items = dict(_items(_step(scheduler))["w1"])
    assert items["plain"].logprobs is None
    (first, second) = items["asked"].logprobs
    assert first == _logprob(-1.0) and second is NO_LOGPROB
    assert scheduler.push("asked", [7, 8], "stop", [_logprob(-2.0), _logprob(-3.0)])  # past max_tokens: cut
    assert _items(_step(scheduler))["w1"] == [("asked", Tokens([7], "length", None, [_logprob(-2.0)]))]


def test_every_worker_gets_its_usual_ids_in_the_columns():
    """A worker registered by Hello and one that joined by heartbeat (an engine that restarted) alike."""
    scheduler = _scheduler()
    scheduler.hello("hello", 2, 0.0)
    assert scheduler.heartbeat("joined", 0, 0.0)
    for index in range(4):
        scheduler.submit(f"r{index}", [1], RequestParams(max_tokens=50), list(range(10)))
    _step(scheduler)
    batches = {plan.worker: plan.batch for plan in _step(scheduler).workers}
    assert sorted(batches) == ["hello", "joined"]
    for batch in batches.values():
        assert len(batch.rids) == 2 and len(batch.ids) == 2 and batch.extras == {}


def test_the_next_liveness_deadline_is_the_first_moment_a_worker_could_be_declared_lost():
    scheduler = _scheduler(heartbeat_timeout_s=1.0, answer_timeout_s=5.0)
    registry = scheduler.registry
    assert registry.next_deadline() is None  # no worker: nothing to judge
    scheduler.hello("w1", 1, 10.0)
    scheduler.hello("w2", 2, 10.4)
    assert registry.next_deadline() == 11.0  # w1's heartbeat timeout
    scheduler.heartbeat("w1", 0, 10.8)
    assert registry.next_deadline() == 11.4  # now w2's
    assert scheduler.expire_workers(11.39) == []
    scheduler.heartbeat("w1", 0, 11.5)
    assert scheduler.expire_workers(11.41) == ["w2"]  # at its deadline, not later
    registry.sent("w1", 3, 11.6)  # w1 owes an answer from 11.6: lost at 16.6 without progress, heartbeats or not
    for now in (12.0, 13.0, 14.0, 15.0, 16.0):
        scheduler.heartbeat("w1", 0, now)
        assert registry.next_deadline() == min(now + 1.0, 16.6)
    assert scheduler.expire_workers(16.61) == ["w1"]
