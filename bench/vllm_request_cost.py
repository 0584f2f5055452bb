"""A request's fixed cost in the front, side by side on one vLLM engine config: `vllm serve` and `detok serve
--source vllm` on the same flags, each over its own engine core running engine_stub's model-free worker (vLLM's
engine core and scheduler, no model: the engine side costs the same for both and takes little of the machine).
C clients each send R 1-token chat completions one after another (a user message of --prompt-chars characters of
corpus text, a different one per request, streamed), after a warm-up; per system, the CPU seconds of every
front-side process (vLLM's API server; detok's supervisor, front, engine process and workers) per completed
request, and requests per second. Both pay the tokenizer (vLLM's API server tokenizes; detok's front has its encode
cache, which a different message per request cannot use). Medians over --runs.

    python bench/vllm_request_cost.py [--clients 16] [--requests 50] [--runs 3] [--prompt-chars 1024]
                                      [--systems vllm detok-vllm] [--engine-flag=--api-server-count=2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_vllm import group
from common import cpu_seconds, load_average, machine_line, print_table
from gateway_procs import MODEL
from request_cost import chat_bodies, send_all
from sse_client import install_uvloop
from vllm_procs import DESCRIPTIONS, engine_flags, running_system, vllm_cpu


def measure(system: Any, bodies: list[bytes], clients: int) -> dict[str, Any]:
    front, _ = system.front_side()
    before = {role: cpu_seconds(pid) for role, pid in front.items()}
    stats, wall = asyncio.run(send_all(system.url, bodies, clients))
    cpu = {role: cpu_seconds(pid) - before[role] for role, pid in front.items()}
    done = len(stats.ttft_ms)
    groups: dict[str, float] = {}
    for role, seconds in cpu.items():
        groups[group(role)] = groups.get(group(role), 0.0) + seconds
    return {
        "requests": done, "failed": len(bodies) - done, "requests_per_s": done / wall,
        "us_front_side": sum(cpu.values()) / max(done, 1) * 1e6,
        **{f"us_{name}": seconds / max(done, 1) * 1e6 for name, seconds in groups.items()},
        "ttft_p50_ms": statistics.median(stats.ttft_ms) if stats.ttft_ms else None,
    }  # fmt: skip


COLUMNS = [
    ("system", "system", "s"),
    ("requests_per_s", "requests/s", ",.0f"),
    ("us_front_side", "front side us/request", ",.0f"),
    ("us_vllm", "vLLM API", ",.0f"),
    ("us_detok_serve", "d.serve", ",.0f"),
    ("us_detok_front", "d.front", ",.0f"),
    ("us_detok_engine", "d.engine", ",.0f"),
    ("us_detok_workers", "d.workers", ",.0f"),
    ("ttft_p50_ms", "TTFT p50 ms", ".1f"),
    ("failed", "failed", "d"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=50, help="per client and run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-chars", type=int, default=1024)
    parser.add_argument("--systems", nargs="+", choices=("vllm", "detok-vllm"), default=["vllm", "detok-vllm"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=15.0, help="the model-free worker's step time")
    parser.add_argument("--engine-flag", action="append", default=[], metavar="FLAG")
    args = parser.parse_args()
    install_uvloop()
    print(machine_line())
    model = vllm_cpu.model_dir()
    flags = engine_flags(512, 32768) + ["--worker-cls", vllm_cpu.MODEL_FREE_WORKER] + args.engine_flag
    env = {vllm_cpu.MODEL_FREE_STEP_ENV: str(args.step_ms)}
    count = args.clients * args.requests
    table = []
    with tempfile.TemporaryDirectory(prefix="detok-bench-request-cost-") as tmp:
        for name in args.systems:
            print(f"{name}: {DESCRIPTIONS[name]}; load {load_average()}", flush=True)
            with running_system(name, model, flags, Path(tmp), args.workers, env) as system:
                asyncio.run(send_all(system.url, chat_bodies(MODEL, 64, args.prompt_chars, True), args.clients))
                runs = []
                for run in range(args.runs):
                    # a different message per request and per run: no front may answer from a cache of whole prompts
                    bodies = chat_bodies(MODEL, count * (run + 2), args.prompt_chars, True)[count * (run + 1) :]
                    runs.append(measure(system, bodies, args.clients))
                    print(f"  run {run + 1}: {runs[-1]['us_front_side']:,.0f} us/request, "
                          f"{runs[-1]['requests_per_s']:,.0f} requests/s", flush=True)  # fmt: skip
                row: dict[str, Any] = {"system": name}
                for key in runs[0]:
                    values = [r[key] for r in runs if r.get(key) is not None]
                    row[key] = statistics.median(values) if values else None
                row["failed"] = sum(r["failed"] for r in runs)
                table.append(row)
            time.sleep(1)
    print()
    print_table(table, COLUMNS)
    by = {row["system"]: row for row in table}
    if "vllm" in by and "detok-vllm" in by:
        ratio = by["detok-vllm"]["us_front_side"] / by["vllm"]["us_front_side"]
        print(f"\ndetok's front side per request: {ratio:.2f}x vLLM's API server's (target <= 0.4x)")
    print(f"load average at end: {load_average()}; {args.clients} clients x {args.requests} requests, {args.runs} runs")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
