"""The local sources' loop (engine_stub/local.py) over real ipc sockets: a request its source cannot plan is
accepted, then failed with the source's error (its front gets the Reject, the failure counts as a bad frame)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from helpers.bus_peers import bus_config, short_runtime_dir
from helpers.fixtures import load_fixture_tokenizer

from detok_worker.bus.codec import encode, front_decoder
from detok_worker.bus.messages import Reject, RequestParams, Submit
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
