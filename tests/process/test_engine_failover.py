"""Real engine + two real workers: a worker killed mid-stream costs no client a character."""

from __future__ import annotations

import os
import signal

from helpers.bus_peers import bus_config, short_runtime_dir, start_process, stop_process

from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.messages import DetokParams, RequestParams
from detok_worker.engine.sources.base import RunOptions
from detok_worker.engine.sources.factory import run_source
from detok_worker.worker.process import run_worker
from engine_stub.planned import load_corpus


def test_killed_worker_rids_are_reopened_exactly_once(qwen3):
    passages = load_corpus()
    # long enough (hundreds of tokens at 5 ms a step) that both workers hold live rids when one is killed
    prompts = {f"r{i}": "\n".join(passages[i % len(passages) :][:4]) for i in range(8)}
    stops = {"r1": ["e"], "r4": ["。"]}  # two requests with stop strings, to end mid-text
    with short_runtime_dir() as runtime:
        config = bus_config(runtime, **{"engine.source": "echo", "engine.step_interval_ms": 5.0})
        with FrontCollector(config) as front:
            workers = {wid: start_process(run_worker, config, wid) for wid in ("w1", "w2")}
            engine = start_process(run_source, config, RunOptions())
            try:
                assert front.wait_for(
                    lambda: front.engine_stats is not None and len(front.engine_stats.workers) == 2, 60
                )
                for rid, text in prompts.items():
                    detok = DetokParams(stop=stops.get(rid, []))
                    front.submit(rid, qwen3.encode(text).ids, RequestParams(max_tokens=4096, detok=detok))
                # kill w1 once every request has streamed some text
                assert front.wait_for(lambda: all(front.requests[rid].chars > 0 for rid in prompts if rid != "r1"), 30)
                os.kill(workers["w1"].pid, signal.SIGKILL)
                assert front.wait_done(prompts, 60)
                assert front.wait_for(lambda: front.engine_stats.reopened > 0, 10)
            finally:
                assert stop_process(engine) == 0
                for process in workers.values():
                    stop_process(process)
    for rid, text in prompts.items():
        got = front.requests[rid]
        expected = text
        for stop in stops.get(rid, []):
            expected = expected[: expected.index(stop)] if stop in expected else expected
        assert got.text == expected, rid
        assert got.gaps == 0
        assert got.finish == "stop"
