"""A real engine process with a local source. The test plays the workers (DEALER) and the front (FrontCollector),
or runs real workers; also recording and replaying traces."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import msgspec
from helpers.bus_peers import PlayedWorker, bus_config, raw_push, short_runtime_dir, start_process, stop_process
from helpers.bus_rows import token_rows
from helpers.fixtures import REPO

from detok_worker.bus.codec import encode
from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.messages import (
    DetokParams,
    Finish,
    Heartbeat,
    Hello,
    RequestParams,
    Shutdown,
    TokenBatch,
)
from detok_worker.engine.plans import PROMPT_TAIL
from detok_worker.engine.sources.base import RunOptions
from detok_worker.engine.sources.factory import run_source
from detok_worker.trace.format import TRACE_VERSION, RecordedRequest, Trace, TraceHeader, read_trace, write_trace
from detok_worker.worker.process import run_worker
from engine_stub.planned import load_corpus, primary_eos_id


class TokenLog:
    """What a played worker received, per rid."""

    def __init__(self, worker: PlayedWorker, front: FrontCollector) -> None:
        self.worker = worker
        self.front = front
        self.ids: dict[str, list[int]] = {}
        self.opens: dict[str, list] = {}
        self.finish: dict[str, str] = {}

    def pump(self, timeout_s: float = 0.05) -> list[TokenBatch]:
        batches = []
        while (message := self.worker.recv(timeout_s)) is not None:
            timeout_s = 0
            if isinstance(message, TokenBatch):
                batches.append(message)
                for open_ in message.opens:
                    self.opens.setdefault(open_.rid, []).append(open_)
                for rid, item in token_rows(message):
                    self.ids.setdefault(rid, []).extend(item.ids)
                    if item.finish is not None:
                        self.finish[rid] = item.finish
        return batches

    def wait(self, predicate, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, "timed out"
            self.worker.heartbeat(0)
            self.pump()
            self.front.poll(0)


def test_engine_with_played_worker_and_front(qwen3):
    eos = primary_eos_id(qwen3)
    prompt = qwen3.encode("Echo these words back to me, exactly as they are, please. 👋 你好").ids
    with short_runtime_dir() as runtime:
        config = bus_config(
            runtime, **{"engine.source": "echo", "engine.step_interval_ms": 2.0, "engine.heartbeat_timeout_s": 30.0}
        )
        with FrontCollector(config) as front:
            engine = start_process(run_source, config, RunOptions())
            try:
                # no worker yet: Reject
                front.submit("early", prompt, RequestParams(max_tokens=50))
                assert front.wait_done(["early"], 60)
                assert front.requests["early"].rejected

                with PlayedWorker(config, "pw") as worker:
                    log = TokenLog(worker, front)
                    worker.send(Hello("pw", 1))
                    log.wait(lambda: front.engine_stats is not None and "pw" in front.engine_stats.workers)

                    # echo: prompt ids then EOS, Open first, EOS ids added to the stop ids
                    params = RequestParams(max_tokens=500, detok=DetokParams(stop=["zz"], stop_token_ids=[5]))
                    front.submit("echo", prompt, params)
                    log.wait(lambda: "echo" in log.finish)
                    assert log.ids["echo"] == [*prompt, eos]
                    assert log.finish["echo"] == "stop"
                    (open_,) = log.opens["echo"]
                    assert open_.prompt_tail == prompt[-PROMPT_TAIL:]
                    assert open_.params.stop == ["zz"]
                    assert set(open_.params.stop_token_ids) == {5, *qwen3.eos_token_ids}

                    # max_tokens
                    front.submit("short", prompt, RequestParams(max_tokens=3))
                    log.wait(lambda: "short" in log.finish)
                    assert (log.ids["short"], log.finish["short"]) == (prompt[:3], "length")

                    # ignore_eos: no EOS stop ids
                    front.submit("noeos", prompt, RequestParams(max_tokens=2, ignore_eos=True))
                    log.wait(lambda: "noeos" in log.finish)
                    assert log.opens["noeos"][0].params.stop_token_ids == []

                    # Finish from the worker stops generation
                    long_prompt = prompt * 20
                    front.submit("finished", long_prompt, RequestParams(max_tokens=5000))
                    log.wait(lambda: "finished" in log.ids)
                    worker.send(Finish("finished", "stop", "zz"))
                    front.submit("after-finish", prompt[:10], RequestParams(max_tokens=50))
                    log.wait(lambda: "after-finish" in log.finish)
                    log.pump(0.2)
                    assert "finished" not in log.finish
                    assert len(log.ids["finished"]) < len(long_prompt) // 2

                    # Abort from the front
                    front.submit("aborted", long_prompt, RequestParams(max_tokens=5000))
                    log.wait(lambda: "aborted" in log.ids)
                    front.abort("aborted")
                    log.wait(lambda: "aborted" in log.finish)
                    assert log.finish["aborted"] == "abort"
                    assert len(log.ids["aborted"]) < len(long_prompt)

                    # garbage at the engine's PULL and ROUTER
                    rng = random.Random(3)
                    push_sockets, push = raw_push(config, "engine")
                    try:
                        for _ in range(20):
                            push.send(rng.randbytes(rng.randint(1, 50)))
                        push.send(encode(Hello("front?", 1)))  # valid, wrong socket
                        push.send(msgspec.msgpack.encode(["submit", "r", "not ids", [1]]))
                        push.send_multipart([b"a", b"b"])
                    finally:
                        push_sockets.close()
                    for _ in range(20):
                        worker.send_raw(rng.randbytes(rng.randint(1, 50)))
                    worker.send_raw(b"two", b"parts")
                    worker.send_raw(msgspec.msgpack.encode(["finish", 7, None]))
                    expected_bad = 20 + 1 + 1 + 1 + 20 + 1 + 1

                    def bad_counted() -> bool:
                        stats = front.engine_stats
                        return stats is not None and sum(stats.bad_frames.values()) == expected_bad

                    log.wait(bad_counted)
                    assert engine.is_alive()

                    # a worker unknown to the engine that holds rids (e.g. from before an engine restart) is told to go
                    with PlayedWorker(config, "stale") as stale:
                        stale.send(Heartbeat("stale", 2))
                        message = stale.recv(10)
                        assert isinstance(message, Shutdown)

                    # still serving, and state freed everywhere
                    front.submit("last", prompt[:4], RequestParams(max_tokens=50))
                    log.wait(lambda: "last" in log.finish)
                    assert log.ids["last"] == [*prompt[:4], eos]

                    def idle() -> bool:
                        stats = front.engine_stats
                        return stats is not None and stats.live_rids == 0 and stats.workers == {"pw": 0}

                    log.wait(idle)
                    assert front.engine_stats.aborted == 1
            finally:
                assert stop_process(engine) == 0


def test_engine_corpus_source_with_a_real_worker_and_recording(qwen3, tmp_path):
    passages = set(load_corpus())
    record = tmp_path / "run.trace"
    with short_runtime_dir() as runtime:
        config = bus_config(
            runtime, **{"engine.source": "corpus", "engine.step_interval_ms": 1.0, "engine.record": str(record)}
        )
        with FrontCollector(config) as front:
            worker = start_process(run_worker, config, "w1")
            engine = start_process(run_source, config, RunOptions())
            try:
                assert front.wait_for(lambda: front.engine_stats is not None and front.engine_stats.workers, 60)
                rids = [f"c{i}" for i in range(8)]
                for rid in rids:
                    front.submit(rid, [1, 2, 3], RequestParams(max_tokens=4096))
                front.submit("cut", [1, 2, 3], RequestParams(max_tokens=5))
                assert front.wait_done([*rids, "cut"], 60)
            finally:
                assert stop_process(engine) == 0
                assert stop_process(worker) == 0
    trace = read_trace(record)
    assert not trace.truncated
    recorded = {request.rid: request for request in trace.requests}
    assert set(recorded) == {*rids, "cut"}
    eos = primary_eos_id(qwen3)
    for rid in rids:
        got = front.requests[rid]
        ids = recorded[rid].output_ids
        assert ids[-1] == eos and recorded[rid].finish == "stop"
        assert got.text == qwen3.decode(ids[:-1]) and got.text in passages
        assert (got.finish, got.stop_reason, got.n_tokens) == ("stop", eos, len(ids))
        assert recorded[rid].prompt_ids == [1, 2, 3]
        assert len(recorded[rid].token_times_ns) == len(ids)
    cut = front.requests["cut"]
    assert (cut.finish, cut.n_tokens) == ("length", 5)
    assert cut.text == qwen3.decode(recorded["cut"].output_ids)


def test_replay_of_a_recorded_trace_gives_identical_texts(qwen3, tmp_path):
    """Record an echo run with stop strings, then replay the trace (the engine generates its requests)."""
    record = tmp_path / "echo.trace"
    prompts = {
        "a": ("First request: a plain sentence that ends. STOP and nothing after.", ["STOP"]),
        "b": ("Second: 🇯🇵 flags, 👍🏽 tones, and 東京の朝.", []),
        "c": ("Third, with a visible stop: alpha beta gamma", ["beta"]),
    }
    with short_runtime_dir() as runtime:
        overrides = {"engine.source": "echo", "engine.step_interval_ms": 1.0}
        config = bus_config(runtime, **overrides, **{"engine.record": str(record)})
        with FrontCollector(config) as front:
            worker = start_process(run_worker, config, "w1")
            engine = start_process(run_source, config, RunOptions())
            try:
                assert front.wait_for(lambda: front.engine_stats is not None and front.engine_stats.workers, 60)
                for rid, (text, stops) in prompts.items():
                    detok = DetokParams(stop=stops, include_stop_str_in_output=rid == "c")
                    front.submit(rid, qwen3.encode(text).ids, RequestParams(max_tokens=200, detok=detok))
                assert front.wait_done(prompts, 30)
            finally:
                assert stop_process(engine) == 0
        first = {rid: front.requests[rid].text for rid in prompts}
        assert first["a"] == "First request: a plain sentence that ends. "
        assert first["b"] == prompts["b"][0]
        assert first["c"] == "Third, with a visible stop: alpha beta"

        replay_config = bus_config(runtime, **{"engine.step_interval_ms": 1.0, "engine.replay_speed": 0.0})
        with FrontCollector(replay_config) as replay_front:
            replay_engine = start_process(run_source, replay_config, RunOptions(str(record), exit_after_replay=True))
            try:
                assert replay_front.wait_done(prompts, 60)
                replay_engine.join(30)
                assert replay_engine.exitcode == 0  # it ended on its own after the replay
            finally:
                stop_process(replay_engine)
                assert stop_process(worker) == 0
        assert {rid: replay_front.requests[rid].text for rid in prompts} == first


def test_engine_stub_command_serves_and_exits_cleanly():
    with short_runtime_dir() as runtime:
        config = bus_config(runtime)
        argv = [sys.executable, "-m", "engine_stub", "--runtime-dir", runtime, "--source", "echo"]
        assert subprocess.run([*argv, "--step-interval-ms", "-1"], cwd=REPO, capture_output=True).returncode == 2
        with FrontCollector(config) as front:
            process = subprocess.Popen(argv, cwd=REPO, stderr=subprocess.PIPE)
            try:
                front.submit("x", [1, 2, 3], RequestParams(max_tokens=5))
                assert front.wait_done(["x"], 60)
                assert front.requests["x"].rejected  # no worker is alive
            finally:
                process.send_signal(signal.SIGTERM)
                assert process.wait(15) == 0, process.stderr.read().decode() if process.stderr else ""


def test_trace_source_streams_recorded_outputs_round_robin(tmp_path):
    header = TraceHeader(TRACE_VERSION, "qwen3", "h", 0.0, "test")
    recorded = [
        RecordedRequest("a", 0, [1], RequestParams(max_tokens=9), [10, 11, 12], [1_000_000, 2_000_000, 30_000_000]),
        RecordedRequest("b", 0, [2], RequestParams(max_tokens=9), [20, 21], [1_000_000, 2_000_000]),
    ]
    path = tmp_path / "src.trace"
    write_trace(path, Trace(header, recorded))
    with short_runtime_dir() as runtime:
        overrides = {"engine.source": "trace", "engine.trace": str(path), "engine.heartbeat_timeout_s": 30.0}
        config = bus_config(runtime, **overrides, **{"engine.step_interval_ms": 1.0})
        with FrontCollector(config) as front, PlayedWorker(config, "pw") as worker:
            engine = start_process(run_source, config, RunOptions())
            try:
                log = TokenLog(worker, front)
                worker.send(Hello("pw", 1))
                log.wait(lambda: front.engine_stats is not None and "pw" in front.engine_stats.workers, 60)
                for rid in ("x", "y", "z"):
                    front.submit(rid, [7], RequestParams(max_tokens=50))
                log.wait(lambda: {"x", "y", "z"} <= set(log.finish))
                assert [log.ids[rid] for rid in ("x", "y", "z")] == [[10, 11, 12], [20, 21], [10, 11, 12]]
            finally:
                assert stop_process(engine) == 0
