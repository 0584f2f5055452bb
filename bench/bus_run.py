"""One end-to-end bus run for bench_bus.py and bench_scaling.py: the engine stub (echo source, flat out), N worker
processes (detok's, or bench/null_worker.py), and this process as the front-side collector (no HTTP).

Every request's prompt is a slice of corpus ids; the echo source generates exactly those ids then EOS, so the
output of every request is known and the run is checked for exactness (real workers) or completeness (null).
Requests are submitted only once the engine reports every worker alive, so least-load routing spreads them
evenly. Throughput: delivered tokens / (last final delta - first submit). Latency: per TextBatch, engine send
(TokenBatch.sent_ns, copied by the worker) to arrival here.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import msgspec
from common import CONFIGS, HERE, QWEN3_DIR, REPO, cpu_seconds, percentile

from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.messages import DetokParams, RequestParams
from detok_worker.config import DetokConfig, load_config
from detok_worker.process.supervisor import Supervisor

NULL_WORKER = HERE / "null_worker.py"


@dataclass
class BusResult:
    workers: int
    worker_kind: str  # detok | null
    streams: int
    tokens: int
    elapsed_s: float
    tokens_per_s: float
    latency_p50_ms: float
    latency_p99_ms: float
    batches: int
    finished: int
    exact: int  # requests whose text equals decode(ids) (null workers: requests with every token delivered)
    # CPU per delivered token of each hop over the run (us): the engine, the workers (summed), this collector
    engine_us: float = 0.0
    workers_us: float = 0.0
    collector_us: float = 0.0

    def row(self) -> dict[str, Any]:
        return asdict(self)


def bench_config(workers: int, streams: int, high_water_mark: int, tokenizer_path: str = "") -> DetokConfig:
    return load_config(
        CONFIGS / "bench.toml",
        {
            "worker.count": workers,
            "worker.stats_interval_s": 1.0,
            "engine.source": "echo",
            "engine.step_interval_ms": 0.0,
            "engine.max_batch": streams,
            "engine.tokens_per_step": 1,
            "bus.high_water_mark": high_water_mark,
            "logging.level": "WARNING",
            "tokenizer.path": tokenizer_path,
        },
    )


def run_bus(
    config: DetokConfig,
    prompts: list[list[int]],
    expected: list[str] | None,
    *,
    null: bool,
    timeout_s: float = 240.0,
) -> BusResult:
    """Run `prompts` (echoed back as outputs) through the pipeline; child processes are always cleaned up."""
    workers = config.worker.count
    # the children run `python -m detok_worker.cli`: let them import this checkout from any working directory
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    supervisor = Supervisor(config, with_front=False)
    supervisor.prepare()
    if null:
        for child in supervisor.children:
            if child.role == "worker":
                worker_id = child.argv[child.argv.index("--id") + 1]
                child.argv = [
                    sys.executable,
                    str(NULL_WORKER),
                    "--config",
                    str(supervisor.config_path),
                    "--id",
                    worker_id,
                ]
    collector = FrontCollector(supervisor.config)  # binds the front endpoint before any child starts
    try:
        supervisor.start()
        alive = collector.wait_for(
            lambda: collector.engine_stats is not None and len(collector.engine_stats.workers) >= workers, 60.0
        )
        if not alive:
            raise RuntimeError(f"not all {workers} workers registered with the engine within 60 s")
        params = RequestParams(max_tokens=max(len(p) for p in prompts) + 1, detok=DetokParams(skip_special_tokens=True))
        rids = [f"bench-{index}" for index in range(len(prompts))]
        pids = {child.role + str(index): child.pid for index, child in enumerate(supervisor.children) if child.pid}
        cpu_before = {role: cpu_seconds(pid) for role, pid in pids.items()}
        collector_before = time.process_time()
        start_ns = time.time_ns()
        for rid, prompt in zip(rids, prompts, strict=True):
            collector.submit(rid, prompt, params)
        collector.wait_done(rids, timeout_s)
        collector_cpu = time.process_time() - collector_before
        cpu = {role: cpu_seconds(pid) - cpu_before[role] for role, pid in pids.items()}
    finally:
        collector.close()
        supervisor.close()
    requests = [collector.requests[rid] for rid in rids]
    last_ns = max((r.last_ns or 0 for r in requests), default=start_ns)
    elapsed = max(last_ns - start_ns, 1) / 1e9
    tokens = sum(r.n_tokens for r in requests)
    latencies = [ns / 1e6 for ns in collector.latencies_ns]
    if expected is not None:
        exact = sum(r.done and r.text == want for r, want in zip(requests, expected, strict=True))
    else:
        exact = sum(r.done and r.n_tokens == len(p) + 1 for r, p in zip(requests, prompts, strict=True))
    return BusResult(
        workers=workers,
        worker_kind="null" if null else "detok",
        streams=len(prompts),
        tokens=tokens,
        elapsed_s=round(elapsed, 4),
        tokens_per_s=round(tokens / elapsed, 1),
        latency_p50_ms=round(percentile(latencies, 50), 3),
        latency_p99_ms=round(percentile(latencies, 99), 3),
        batches=len(latencies),
        finished=sum(r.done for r in requests),
        exact=exact,
        engine_us=round(sum(s for role, s in cpu.items() if role.startswith("engine")) / max(tokens, 1) * 1e6, 3),
        workers_us=round(sum(s for role, s in cpu.items() if role.startswith("worker")) / max(tokens, 1) * 1e6, 3),
        collector_us=round(collector_cpu / max(tokens, 1) * 1e6, 3),
    )


def with_overrides(config: DetokConfig, **sections: dict[str, Any]) -> DetokConfig:
    """config with some fields of some sections replaced, e.g. with_overrides(c, worker={"count": 2})."""
    changes = {name: msgspec.structs.replace(getattr(config, name), **fields) for name, fields in sections.items()}
    return msgspec.structs.replace(config, **changes)


def prompt_ids_for(tokenizer: Any, streams: int, tokens: int) -> tuple[list[list[int]], list[str]]:
    """Prompts (= outputs, echoed) of `tokens` corpus ids each, and the text each must come back as."""
    from common import corpus_ids, make_streams

    prompts = make_streams(corpus_ids(tokenizer), streams, tokens)
    # the worker decodes the output with the prompt's last ids as context: the expected text is the decode of the
    # output ids in that context (skip_special_tokens, EOS hidden)
    expected = []
    for ids in prompts:
        tail = ids[-8:]
        full = tokenizer.decode(tail + ids, skip_special_tokens=True)
        expected.append(full[len(tokenizer.decode(tail, skip_special_tokens=True)) :])
    return prompts, expected


def default_tokenizer_path() -> str:
    return str(QWEN3_DIR)
