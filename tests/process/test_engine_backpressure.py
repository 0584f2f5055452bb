"""A worker that stops reading does not stall the engine: its rids pause (nothing lost or repeated) while other
workers' rids go on; when it reads again, its rids resume."""

from __future__ import annotations

import random
import time

from helpers.bus_peers import PlayedWorker, bus_config, short_runtime_dir, start_process, stop_process
from helpers.bus_rows import token_rows

from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.messages import Hello, RequestParams, TokenBatch
from detok_worker.engine.sources.base import RunOptions
from detok_worker.engine.sources.factory import run_source
from engine_stub.planned import primary_eos_id

PROMPT_IDS = 20_000


def _read(worker: PlayedWorker, ids: dict[str, list[int]], finished: set[str], timeout_s: float) -> None:
    message = worker.recv(timeout_s)
    while message is not None:
        if isinstance(message, TokenBatch):
            for open_ in message.opens:
                assert open_.rid not in ids, "re-opened although nothing was lost"
                ids[open_.rid] = []
            for rid, item in token_rows(message):
                ids[rid].extend(item.ids)
                if item.finish is not None:
                    finished.add(rid)
        message = worker.recv(0)


def test_stalled_worker_pauses_only_its_rids(qwen3):
    eos = primary_eos_id(qwen3)
    rng = random.Random(5)
    # the echo engine answers each prompt: 40 of this length are several MB, far more than the sockets' buffers
    # hold (a stalled worker must stall its rids, not have them all sent into the kernel), and no slow rid can end
    # while the slow worker still reads the opens
    slow_prompts = {f"s{i}": [rng.randrange(1000, 20000) for _ in range(PROMPT_IDS)] for i in range(40)}
    fast_prompt = [rng.randrange(1000, 20000) for _ in range(PROMPT_IDS)]
    with short_runtime_dir() as runtime:
        config = bus_config(
            runtime,
            **{
                "bus.high_water_mark": 2,
                "engine.source": "echo",
                "engine.step_interval_ms": 0.0,
                "engine.tokens_per_step": 64,
                "engine.heartbeat_timeout_s": 60.0,
                "engine.batch_answer_timeout_s": 60.0,  # the slow worker stops reading on purpose
            },
        )
        with (
            FrontCollector(config) as front,
            PlayedWorker(config, "slow") as slow,
            PlayedWorker(config, "fast") as fast,
        ):
            engine = start_process(run_source, config, RunOptions())
            try:
                slow.send(Hello("slow", 1))
                assert front.wait_for(
                    lambda: front.engine_stats is not None and "slow" in front.engine_stats.workers, 60
                )
                for rid, prompt in slow_prompts.items():
                    front.submit(rid, prompt, RequestParams(max_tokens=PROMPT_IDS + 1))
                # the slow worker reads until every one of its rids is open, then stops reading: had it stopped at
                # once, the first rids' ids could fill its queue before the later rids' opens got in
                slow_ids: dict[str, list[int]] = {}
                slow_done: set[str] = set()
                deadline = time.monotonic() + 10
                while len(slow_ids) < 40 and time.monotonic() < deadline:
                    _read(slow, slow_ids, slow_done, 0.1)
                assert sorted(slow_ids) == sorted(slow_prompts) and not slow_done
                # the engine reports its stats once a second; the message names the last report if none comes
                assert front.wait_for(lambda: front.engine_stats.workers.get("slow") == 40, 30), front.engine_stats
                fast.send(Hello("fast", 2))
                assert front.wait_for(lambda: "fast" in front.engine_stats.workers, 10)
                front.submit("f", fast_prompt, RequestParams(max_tokens=PROMPT_IDS + 1))

                fast_ids: dict[str, list[int]] = {}
                fast_done: set[str] = set()
                while "f" not in fast_done:
                    fast.heartbeat(1)
                    _read(fast, fast_ids, fast_done, 1.0)
                assert fast_ids["f"] == [*fast_prompt, eos]

                # the slow worker's queue is full: its rids wait, all still live in the engine (without the pause
                # they would have ended with "f": same length, submitted earlier)
                assert front.wait_for(lambda: front.engine_stats.live_rids == 40, 5)

                while len(slow_done) < 40:
                    slow.heartbeat(40)
                    _read(slow, slow_ids, slow_done, 1.0)
                for rid, prompt in slow_prompts.items():
                    assert slow_ids[rid] == [*prompt, eos], rid
                assert front.wait_for(lambda: front.engine_stats.live_rids == 0, 10)
                assert front.engine_stats.reopened == 0
            finally:
                assert stop_process(engine) == 0
