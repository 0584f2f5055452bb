"""The local sources' loop (engine_stub/local.py) over real ipc sockets: a request its source cannot plan is
accepted, then failed with the source's error (its front gets the Reject, the failure counts as a bad frame)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from helpers.bus_peers import bus_config, short_runtime_dir
from helpers.fixtures import load_fixture_tokenizer

from detok_worker.bus.codec import encode, front_decoder
from detok_worker.bus.messages import Abort, Reject, RequestParams, Submit
from detok_worker.bus.sockets import BusSockets
from engine_stub.local import BAD_SOURCE, EngineProcess
from engine_stub.planned import Plan


class FailingSource:
    name = "failing"

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan:
        raise RuntimeError("no plan today")


def test_a_request_the_source_cannot_plan_fails_with_its_error() -> None:
    with short_runtime_dir() as runtime_dir:
        config = bus_config(runtime_dir, **{"engine.stats_interval_s": 60.0})
        with BusSockets(config) as front:
            pull = front.front_pull(0)
            to_engine = front.engine_push()
            process = EngineProcess(config, load_fixture_tokenizer("qwen3"), FailingSource())
            try:
                to_engine.send(encode(Submit("r", [1, 2], RequestParams(max_tokens=4))))
                deadline = time.monotonic() + 5.0
                while not process.link.decoder.bad_frames and time.monotonic() < deadline:
                    for submit in process.link.poll(0.02).submitted:
                        process._submit(submit)
                assert process.link.decoder.bad_frames[BAD_SOURCE] == 1
                decoder = front_decoder()
                rejects = []
                while pull.poll(500):
                    if isinstance(message := decoder.decode(pull.recv()), Reject):
                        rejects.append(message)
                assert [(r.rid, r.error) for r in rejects] == [("r", "the engine's token source failed: no plan today")]
                assert process.scheduler.live_rids == 0 and not process.plans.has_work()
            finally:
                process.link.close()


class NumberedSource:
    """Plans each request's output as its submit's number, so a test can tell two requests of one rid apart."""

    name = "numbered"

    def __init__(self) -> None:
        self.planned = 0

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan:
        self.planned += 1
        return Plan([self.planned] * 8)


def test_a_rid_stopped_and_submitted_again_in_one_poll_is_a_new_request() -> None:
    """A front aborts a running rid and submits the same rid again; both reach the engine in one poll. The new
    request runs (the stop is the old one's); taking the submit first would stop the new one, which never ran."""
    with short_runtime_dir() as runtime_dir:
        config = bus_config(runtime_dir, **{"engine.stats_interval_s": 60.0})
        with BusSockets(config) as front:
            to_engine = front.engine_push()
            source = NumberedSource()
            process = EngineProcess(config, load_fixture_tokenizer("qwen3"), source)
            try:
                to_engine.send(encode(Submit("r", [1, 2], RequestParams(max_tokens=8))))
                deadline = time.monotonic() + 5.0
                while source.planned == 0 and time.monotonic() < deadline:
                    process.take_news(process.link.poll(0.02))
                assert "r" in process.plans.requests
                to_engine.send(encode(Abort("r")))
                to_engine.send(encode(Submit("r", [3, 4], RequestParams(max_tokens=8))))
                time.sleep(0.5)  # both frames are in the engine's queue: one poll takes them
                news = process.link.poll(1.0)
                assert (news.stopped, [submit.rid for submit in news.submitted]) == (["r"], ["r"])
                process.take_news(news)
                planned = process.plans.requests.running.get("r") or process.plans.requests.waiting.get("r")
                assert planned is not None and planned.ids == [2] * 8
            finally:
                process.link.close()
