"""A real worker process; the test plays the engine (ROUTER) and the front (PULL, via FrontCollector)."""

from __future__ import annotations

import random
import time

import msgspec
import zmq
from helpers.bus_peers import PlayedEngine, bus_config, short_runtime_dir, start_process, stop_process

from detok_worker.bus.codec import encode
from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.columns import token_batch
from detok_worker.bus.messages import (
    DetokParams,
    Finish,
    Goodbye,
    Heartbeat,
    Hello,
    Open,
    Shutdown,
    Tokens,
)
from detok_worker.worker.process import run_worker

WORKER = "w-test"
TEXTS = {
    "plain": ("The lighthouse keeper wrote the wind and the colour of the water in his logbook.", []),
    "emoji": ("Family 👨‍👩‍👧‍👦 at the beach 🏖️ with flags 🇯🇵🇧🇷 and thumbs 👍🏽👍🏿 everywhere.", []),
    "cjk": ("今天的天气很好，我们决定去山上走一走。東京の朝は早い。", []),
    "stop": ("Write until the marker ### and never past it, please.", ["###"]),
    "visible": ("Count: one, two, three, four.", ["three"]),
}


def _expected(tokenizer, ids: list[int], stops: list[str], visible: bool) -> str:
    text = tokenizer.decode(ids, skip_special_tokens=True)
    hits = [(text.index(s), s) for s in stops if s in text]
    if not hits:
        return text
    start, stop = min(hits)
    return text[: start + (len(stop) if visible else 0)]


def test_worker_serves_interleaved_rids_and_survives_garbage(qwen3):
    with short_runtime_dir() as runtime:
        config = bus_config(runtime)
        with PlayedEngine(config) as engine, FrontCollector(config) as front:
            process = start_process(run_worker, config, WORKER)
            try:
                identity, hello = engine.expect(Hello, 60)
                assert identity == WORKER.encode() and hello == Hello(WORKER, process.pid)
                _, heartbeat = engine.expect(Heartbeat)
                assert heartbeat.worker == WORKER
                assert front.wait_for(lambda: WORKER in front.worker_stats, 10)

                ids = {rid: qwen3.encode(text).ids for rid, (text, _) in TEXTS.items()}
                visible = {"visible"}
                opens = [
                    Open(rid, [], DetokParams(stop=stops, include_stop_str_in_output=rid in visible))
                    for rid, (_, stops) in TEXTS.items()
                ]
                steps = max(len(seq) for seq in ids.values()) // 2 + 1
                for step in range(steps):
                    items = []
                    for rid, seq in ids.items():
                        chunk = seq[2 * step : 2 * step + 2]
                        if chunk or 2 * step == len(seq):
                            last = 2 * step + 2 >= len(seq)
                            items.append((rid, Tokens(chunk, "length" if last else None)))
                    engine.send(identity, token_batch(step, time.time_ns(), opens if step == 0 else [], items))
                assert front.wait_done(TEXTS, 20)
                # at most one TextBatch per TokenBatch (none for one without news: ids past a rid's stop)
                assert 0 < front.text_batches <= steps
                for rid, (_, stops) in TEXTS.items():
                    got = front.requests[rid]
                    assert got.text == _expected(qwen3, ids[rid], stops, rid in visible), rid
                    assert got.gaps == 0 and got.duplicate_chars == 0
                    assert got.finish == ("stop" if stops else "length")
                finishes = {}
                while len(finishes) < 2:  # heartbeats keep coming: wait for the two Finish messages
                    _, finish = engine.expect(Finish, 5)
                    finishes[finish.rid] = finish
                assert finishes == {  # with the ids each client got
                    "stop": Finish("stop", "stop", "###", front.requests["stop"].n_tokens),
                    "visible": Finish("visible", "stop", "three", front.requests["visible"].n_tokens),
                }

                # garbage at the worker's DEALER: random bytes, wrong-schema msgpack, multipart
                rng = random.Random(7)
                garbage = [rng.randbytes(rng.randint(1, 64)) for _ in range(30)]
                garbage += [
                    msgspec.msgpack.encode(["token_batch", "not an int", 0, [], []]),
                    msgspec.msgpack.encode(["tokens", "r", [1]]),  # an item, not a batch
                    msgspec.msgpack.encode({"step": 1}),
                    encode(Hello("x", 1)),  # a valid message of the wrong direction
                    encode(token_batch(1, 0, [], [("r", Tokens(["x"]))])),  # type: ignore[list-item]
                ]
                for frame in garbage:
                    engine.router.send_multipart([identity, frame])
                for _ in range(3):
                    engine.router.send_multipart([identity, b"part one", b"part two"])
                expected_bad = len(garbage) + 3

                def bad_counted() -> bool:
                    stats = front.worker_stats.get(WORKER)
                    return stats is not None and sum(stats.bad_frames.values()) == expected_bad

                assert front.wait_for(bad_counted, 10), front.worker_stats.get(WORKER)
                assert process.is_alive()

                # still working after the garbage; a batch of Opens alone has no news: no TextBatch for it
                after = qwen3.encode("Still here ✅").ids
                batches_before = front.text_batches
                engine.send(identity, token_batch(99, time.time_ns(), [Open("after", [], DetokParams())], []))
                engine.send(identity, token_batch(100, time.time_ns(), [], [("after", Tokens(after, "length"))]))
                assert front.wait_done(["after"], 10)
                assert front.requests["after"].text == "Still here ✅"
                assert front.text_batches == batches_before + 1
                assert front.wait_for(lambda: front.worker_stats[WORKER].live_rids == 0, 5)
                stats = front.worker_stats[WORKER]
                unstopped = sum(len(seq) for rid, seq in ids.items() if not TEXTS[rid][1]) + len(after)
                # tokens arriving after a rid stopped are dropped, not counted
                assert unstopped < stats.tokens_in < sum(len(seq) for seq in ids.values()) + len(after)
            finally:
                exit_code = stop_process(process)
            assert exit_code == 0
            _, goodbye = engine.expect(Goodbye, 5)
            assert goodbye == Goodbye(WORKER)


def test_worker_started_before_the_engine_and_shut_down_by_it(qwen3):
    with short_runtime_dir() as runtime:
        config = bus_config(runtime)
        process = start_process(run_worker, config, WORKER)
        try:
            time.sleep(0.5)  # the worker connects first; ZeroMQ delivers once the engine binds
            with PlayedEngine(config) as engine, FrontCollector(config) as front:
                identity, _ = engine.expect(Hello, 60)
                ids = qwen3.encode("late binding works").ids
                engine.send(
                    identity, token_batch(1, time.time_ns(), [Open("r", [], DetokParams())], [("r", Tokens(ids))])
                )
                engine.send(identity, token_batch(2, time.time_ns(), [], [("r", Tokens([], "abort"))]))
                assert front.wait_done(["r"], 10)
                assert front.requests["r"].text == "late binding works"
                assert front.requests["r"].finish == "abort"
                engine.send(identity, Shutdown("test"))
                engine.expect(Goodbye, 10)
                process.join(10)
                assert process.exitcode == 0
        finally:
            stop_process(process)


def test_stalled_front_blocks_the_worker_but_not_its_heartbeats(qwen3):
    passage = "Streaming text to a reader one piece at a time is an old idea. " * 8
    ids = qwen3.encode(passage).ids
    rids = [f"r{i}" for i in range(64)]
    with short_runtime_dir() as runtime:
        config = bus_config(runtime, **{"bus.high_water_mark": 2})
        with PlayedEngine(config) as engine, FrontCollector(config) as front:
            process = start_process(run_worker, config, WORKER)
            try:
                identity, _ = engine.expect(Hello, 60)
                opens = [Open(rid, [], DetokParams()) for rid in rids]
                # the front does not read: each TextBatch holds ~10 KB of text, so the worker's queue to the front
                # fills, the worker stops taking TokenBatches, and the engine's sends fail
                sent = 0
                while True:
                    batch = token_batch(
                        sent, time.time_ns(), opens if sent == 0 else [], [(r, Tokens(ids)) for r in rids]
                    )
                    try:
                        engine.router.send_multipart([identity, encode(batch)], zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    sent += 1
                    assert sent < 10_000, "no backpressure"
                beats = 0
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline:  # meanwhile the worker keeps heartbeating
                    got = engine.recv(0.2)
                    beats += got is not None and isinstance(got[1], Heartbeat)
                assert beats >= 4
                final = encode(token_batch(sent, time.time_ns(), [], [(rid, Tokens([], "length")) for rid in rids]))
                while True:  # the front reads again: everything flows
                    front.poll(20)
                    try:
                        engine.router.send_multipart([identity, final], zmq.NOBLOCK)
                        break
                    except zmq.Again:
                        continue
                assert front.wait_done(rids, 60)
                assert front.wait_for(lambda: front.text_batches == sent + 1, 10)
                for rid in rids:
                    assert front.requests[rid].text == qwen3.decode(ids * sent)
            finally:
                assert stop_process(process) == 0


def test_an_idle_worker_sleeps_until_its_timers_and_a_stop_signal_wakes_it():
    """With heartbeats and stats a minute apart, the idle worker's loop waits a minute: SIGTERM must still end it at
    once, with its Goodbye."""
    with short_runtime_dir() as runtime:
        config = bus_config(runtime, **{"worker.heartbeat_interval_s": 60.0, "worker.stats_interval_s": 60.0})
        with PlayedEngine(config) as engine, FrontCollector(config):
            process = start_process(run_worker, config, WORKER)
            try:
                engine.expect(Hello, 60)
                engine.expect(Heartbeat)  # the first one goes out at once; the next is a minute away
                time.sleep(0.3)  # the loop is asleep in its poll
                assert stop_process(process, timeout=5) == 0
                _, goodbye = engine.expect(Goodbye, 5)
                assert goodbye == Goodbye(WORKER)
            finally:
                process.kill()
