"""Bus limits against same-uid peers that bypass the front: a 100 MB frame is refused by
the engine's socket (ZMQ_MAXMSGSIZE) and counted, max_tokens 2**40 and an over-long prompt are rejected by the
engine itself, and a worker that heartbeats but never handles a TokenBatch loses its requests to a healthy one."""

from __future__ import annotations

import time

from helpers.bus_peers import PlayedWorker, bus_config, raw_push, short_runtime_dir, start_process, stop_process
from helpers.fault_helpers import rss_kb

from detok_worker.bus.codec import encode
from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.messages import Heartbeat, Hello, RequestParams, Submit
from detok_worker.engine.sources.base import RunOptions
from detok_worker.engine.sources.factory import run_source
from detok_worker.worker.process import run_worker
from engine_stub.planned import load_corpus

BIG_FRAME_BYTES = 100 * 1024 * 1024


def test_engine_refuses_huge_frames_and_unbounded_submits(qwen3):
    prompt = qwen3.encode("Echo these words back to me, exactly as they are.").ids
    with short_runtime_dir() as runtime:
        config = bus_config(
            runtime,
            **{"engine.source": "echo", "engine.step_interval_ms": 2.0, "front.max_prompt_tokens": 1000},
        )
        with FrontCollector(config) as front:
            worker = start_process(run_worker, config, "w1")
            engine = start_process(run_source, config, RunOptions())
            try:
                assert front.wait_for(lambda: front.engine_stats is not None and "w1" in front.engine_stats.workers, 60)
                rss_before = rss_kb(engine.pid)
                sockets, push = raw_push(config, "engine")
                try:
                    push.send(b"\x91" + b"x" * BIG_FRAME_BYTES)  # one 100 MB frame to the engine's PULL
                finally:
                    sockets.close()
                with PlayedWorker(config, "rogue") as rogue:  # and one to its ROUTER
                    rogue.send_raw(b"y" * BIG_FRAME_BYTES)
                    assert front.wait_for(lambda: front.engine_stats.dropped_connections >= 2, 30)
                assert rss_kb(engine.pid) - rss_before < 50_000  # the frames were never taken in (KiB)

                # still serving
                front.submit("after", prompt, RequestParams(max_tokens=100))
                # limits the front enforces, enforced again by the engine
                front.submit("huge-max-tokens", prompt, RequestParams(max_tokens=2**40))
                front.submit("long-prompt", prompt * 100, RequestParams(max_tokens=10))
                assert front.wait_done(["after", "huge-max-tokens", "long-prompt"], 30)
                assert front.requests["after"].text == qwen3.decode(prompt)
                assert front.requests["huge-max-tokens"].rejected
                assert "max_tokens" in front.requests["huge-max-tokens"].error
                assert front.requests["long-prompt"].rejected
                assert f"the prompt has {len(prompt) * 100} tokens" in front.requests["long-prompt"].error
                assert engine.is_alive() and worker.is_alive()
            finally:
                assert stop_process(engine) == 0
                stop_process(worker)


def test_heartbeat_only_worker_loses_its_requests(qwen3):
    passages = load_corpus()
    prompts = {f"r{i}": "\n".join(passages[i % len(passages) :][:2]) for i in range(8)}
    with short_runtime_dir() as runtime:
        config = bus_config(
            runtime,
            **{"engine.source": "echo", "engine.step_interval_ms": 2.0, "engine.batch_answer_timeout_s": 1.5},
        )
        with FrontCollector(config) as front, PlayedWorker(config, "fake") as fake:
            engine = start_process(run_source, config, RunOptions())
            worker = None
            try:
                # the fake joins first, so it is the least loaded worker on ties and surely gets requests
                assert front.wait_for(lambda: front.engine_stats is not None, 60)
                fake.send(Hello("fake", 1))
                assert front.wait_for(lambda: "fake" in front.engine_stats.workers, 10)
                worker = start_process(run_worker, config, "w1")
                assert front.wait_for(lambda: "w1" in front.engine_stats.workers, 60)
                for rid, text in prompts.items():
                    front.submit(rid, qwen3.encode(text).ids, RequestParams(max_tokens=4096))
                # the fake takes its share (least loaded), then only heartbeats, like a stalled worker
                deadline = time.monotonic() + 60
                while not all(front.requests[rid].done for rid in prompts):
                    assert time.monotonic() < deadline, "requests hang on the heartbeat-only worker"
                    fake.send(Heartbeat("fake", 0))
                    front.poll(100)
                assert front.wait_for(lambda: front.engine_stats.reopened >= 1, 5)
            finally:
                assert stop_process(engine) == 0
                if worker is not None:
                    stop_process(worker)
    for rid, text in prompts.items():
        got = front.requests[rid]
        assert (got.text, got.finish, got.gaps) == (text, "stop", 0), rid


def test_submit_frame_over_the_limit_is_dropped_not_decoded(qwen3):
    """The limit is bus.max_message_bytes: a Submit just over a lowered limit is dropped, one under it served."""
    with short_runtime_dir() as runtime:
        config = bus_config(
            runtime, **{"engine.source": "echo", "engine.step_interval_ms": 2.0, "bus.max_message_bytes": 65536}
        )
        with FrontCollector(config) as front:
            worker = start_process(run_worker, config, "w1")
            engine = start_process(run_source, config, RunOptions())
            try:
                assert front.wait_for(lambda: front.engine_stats is not None and "w1" in front.engine_stats.workers, 60)
                sockets, push = raw_push(config, "engine")
                try:
                    push.send(encode(Submit("big", [1000] * 40_000, RequestParams(max_tokens=1))))
                finally:
                    sockets.close()
                assert front.wait_for(lambda: front.engine_stats.dropped_connections >= 1, 30)
                small = qwen3.encode("small enough").ids
                front.submit("small", small, RequestParams(max_tokens=50))
                assert front.wait_done(["small"], 30)
                assert front.requests["small"].text == "small enough"
                assert "big" not in front.requests
            finally:
                assert stop_process(engine) == 0
                stop_process(worker)
