"""EngineLink with two front processes, over real ipc sockets in a private dir: a rid's Reject reaches only the
front that submitted it, a FrontHello aborts the rids its predecessor at that index left, and a front index out of
range is a bad frame. PromptLogprobs go to the rid's front too."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import zmq
from helpers.bus_peers import bus_config, short_runtime_dir

from detok_worker.bus.codec import encode, front_decoder
from detok_worker.bus.messages import (
    Abort,
    Delivered,
    EngineStats,
    FrontHello,
    PromptLogprobs,
    Reject,
    RequestParams,
    Submit,
)
from detok_worker.bus.request_fields import FIELDS
from detok_worker.bus.sockets import BusSockets
from detok_worker.engine.link import EngineLink


def poll_until(link: EngineLink, predicate: Any, timeout_s: float = 5.0) -> list[Any]:
    """Poll the link, collecting its news, until predicate(news so far) holds."""
    submitted: list[Submit] = []
    stopped: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        news = link.poll(0.02)
        submitted += news.submitted
        stopped += news.stopped
        if predicate(submitted, stopped):
            return [submitted, stopped]
    raise AssertionError(f"no such news within {timeout_s} s: {submitted}, {stopped}")


def messages_at(pull: zmq.Socket[Any], kind: type) -> list[Any]:
    """The messages of `kind` a front's PULL has (the engine's stats are broadcast among them)."""
    decoder = front_decoder()
    found = []
    while pull.poll(200):
        message = decoder.decode(pull.recv())
        if isinstance(message, kind):
            found.append(message)
    return found


def rejects_at(pull: zmq.Socket[Any]) -> list[str]:
    return [reject.rid for reject in messages_at(pull, Reject)]


@contextlib.contextmanager
def two_fronts() -> Iterator[tuple[list[zmq.Socket[Any]], zmq.Socket[Any], EngineLink]]:
    """An EngineLink with two front processes: their PULLs, a PUSH to the engine, the link."""
    with short_runtime_dir() as runtime_dir:
        config = bus_config(runtime_dir, **{"front.processes": 2, "engine.stats_interval_s": 60.0})
        with BusSockets(config) as fronts:
            pulls = [fronts.front_pull(0), fronts.front_pull(1)]
            to_engine = fronts.engine_push()
            link = EngineLink(config)
            try:
                yield pulls, to_engine, link
            finally:
                link.close()


def test_rejects_go_to_the_rids_front_and_front_hello_aborts_its_rids() -> None:
    with two_fronts() as (pulls, to_engine, link):
        for rid, front in (("a0", 0), ("a1", 1), ("b1", 1)):
            to_engine.send(encode(Submit(rid, [1, 2], RequestParams(max_tokens=4), 0, front)))
        submitted, _ = poll_until(link, lambda s, _: len(s) == 3)
        for submit in submitted:
            assert link.accept(submit) is not None and link.push(submit.rid, [5, 6])
        link.fail("a1", "engine failure")
        link.fail("a0", "engine failure")
        assert rejects_at(pulls[1]) == ["a1"]
        assert rejects_at(pulls[0]) == ["a0"]

        # front 1 restarts: b1 (its predecessor's) is aborted; nothing of front 0 is touched
        to_engine.send(encode(FrontHello(1, 4242)))
        _, stopped = poll_until(link, lambda _, stopped: stopped)
        assert stopped == ["b1"]
        assert link.scheduler.live_rids == 0 and link.scheduler.aborted == 1

        # a front index outside front.processes has nowhere to be answered: a bad frame, and no crash
        to_engine.send(encode(Submit("x", [1], RequestParams(max_tokens=4), 0, 2)))
        to_engine.send(encode(FrontHello(-1, 1)))
        to_engine.send(encode(Submit("y", [1], RequestParams(max_tokens=4), 0, 1)))
        submitted, _ = poll_until(link, lambda s, _: s)
        assert [submit.rid for submit in submitted] == ["y"]
        assert link.decoder.bad_frames["front_index"] == 2


def test_a_delivered_that_overtakes_the_workers_finish_stops_the_engines_request() -> None:
    """A worker sends its final delta (to the front) and its Finish (to the engine) at once; the front's Delivered
    can reach the engine first. The rid still generates there: the engine loop must hear to stop it."""
    with short_runtime_dir() as runtime_dir:
        config = bus_config(runtime_dir, **{"engine.stats_interval_s": 60.0})
        with BusSockets(config) as front:
            front.front_pull(0)
            to_engine = front.engine_push()
            link = EngineLink(config)
            try:
                to_engine.send(encode(Submit("r", [1, 2], RequestParams(max_tokens=40), 0)))
                (submit,), _ = poll_until(link, lambda s, _: s)
                assert link.accept(submit) is not None and link.push("r", [5, 6])
                to_engine.send(encode(Delivered("r")))
                _, stopped = poll_until(link, lambda _, stopped: stopped)
                assert stopped == ["r"] and not link.push("r", [7])
                to_engine.send(encode(Delivered("r")))  # again: nothing generates any more
                to_engine.send(encode(Submit("s", [1], RequestParams(max_tokens=4), 0)))
                _, stopped = poll_until(link, lambda s, _: s)
                assert stopped == []
            finally:
                link.close()


def test_prompt_logprobs_go_to_the_rids_front_at_the_next_step() -> None:
    with two_fronts() as (pulls, to_engine, link):
        to_engine.send(encode(Submit("p1", [7, 8, 9], RequestParams(max_tokens=4), 0, 1)))
        (submit,), _ = poll_until(link, lambda s, _: len(s) == 1)
        assert link.accept(submit) is not None
        sent = PromptLogprobs("p1", [[8, 3], [9, 9]], [[-1.5, -0.25], [-0.5, -0.5]], [4, 1])
        link.send_prompt_info(sent)
        link.step()
        assert messages_at(pulls[1], PromptLogprobs) == [sent]
        assert messages_at(pulls[0], PromptLogprobs) == []


def test_deferred_submits_come_back_first_and_an_abort_meanwhile_withdraws_one() -> None:
    """An engine loop that starts a burst of Submits a slice at a time hands the rest back (`defer`): the next
    poll returns them before newer ones, and an Abort that arrived in between withdraws its Submit."""
    with short_runtime_dir() as runtime_dir:
        config = bus_config(runtime_dir, **{"engine.stats_interval_s": 60.0})
        with BusSockets(config) as fronts:
            to_engine = fronts.engine_push()
            link = EngineLink(config)
            try:
                for rid in ("a", "b", "c"):
                    to_engine.send(encode(Submit(rid, [1, 2], RequestParams(max_tokens=4))))
                submitted, _ = poll_until(link, lambda s, _: len(s) == 3)
                assert link.accept(submitted[0]) is not None
                link.defer(submitted[1:])
                to_engine.send(encode(Abort("b")))
                to_engine.send(encode(Submit("d", [1, 2], RequestParams(max_tokens=4))))
                submitted, _ = poll_until(link, lambda s, _: "d" in [submit.rid for submit in s])
                assert [submit.rid for submit in submitted] == ["c", "d"]
                assert link.scheduler.aborted == 1 and link.scheduler.live_rids == 1
            finally:
                link.close()


def test_the_engines_stats_announce_the_request_fields_it_does_not_pass_on() -> None:
    """By default an engine takes the fields the gRPC API carries; a source that takes others says so (vLLM's
    engine core: all of them). The names go out in the table's order, whatever order they were given in."""
    with short_runtime_dir() as runtime_dir:
        config = bus_config(runtime_dir, **{"engine.stats_interval_s": 0.05})
        for given, announced in (
            (None, [field.name for field in FIELDS if field.grpc is None]),
            ((), []),
            (("session_id", "temperature"), ["temperature", "session_id"]),
        ):
            with BusSockets(config) as fronts:
                pull = fronts.front_pull(0)
                link = EngineLink(config) if given is None else EngineLink(config, refused_fields=given)
                try:
                    deadline = time.monotonic() + 5
                    stats: list[EngineStats] = []
                    while not stats and time.monotonic() < deadline:
                        link.poll(0.02)
                        stats = messages_at(pull, EngineStats)
                    assert stats and stats[-1].refused_fields == announced
                finally:
                    link.close()
