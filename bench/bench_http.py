"""HTTP end to end: C concurrent SSE clients against a real `detok serve` (front + engine stub + workers).

Each client streams `--requests` completions one after another (corpus source, `--max-tokens` each) through a
minimal asyncio HTTP client (bench/sse_client.py: a full client's per-chunk JSON parsing would be what is
measured). Reported per concurrency: delivered completion tokens/s (from each stream's usage), time to first
token and the gap between consecutive chunks at the client (p50/p99), the engine-to-front latency of the server's
TextBatches (p50/p99, estimated from its /metrics histogram) and the client's own CPU use (the load generator
shares the machine's cores with the server).

    python bench/bench_http.py [--clients 100 1000] [--requests 2] [--max-tokens 128] [--workers 2]
                               [--step-interval-ms 0 20] [--quick] [--json FILE]
    python bench/bench_http.py --per-chunk [--clients 500 1500] [--runs 3] [--fronts 2] [--quick]
                               [--endpoint completions|chat|messages|responses] (http_per_chunk.py)
    python bench/bench_http.py --request-cost [--clients 16] [--requests 25] [--runs 3] [--prompt-chars 1024]
                               [--no-stream] [--profile] (request_cost.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import httpx
from common import machine_line, percentile, print_table, write_json
from prometheus_client.parser import text_string_to_metric_families
from serve_proc import detok_serve
from sse_client import StreamStats, install_uvloop, stream_completion


async def run_clients(url: str, model: str, clients: int, requests: int, max_tokens: int) -> dict[str, Any]:
    stats = StreamStats()

    async def client_loop(index: int) -> None:
        for round_ in range(requests):
            body = {
                "model": model,
                "prompt": f"Client {index} request {round_}: write something.",
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            await stream_completion(url, "/v1/completions", json.dumps(body).encode(), stats)

    cpu_start, wall_start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client_loop(index) for index in range(clients)))
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - cpu_start
    return {
        "clients": clients,
        "requests": stats.requests,
        "errors": stats.errors,
        "tokens": stats.tokens,
        "elapsed_s": round(wall, 3),
        "tokens_per_s": stats.tokens / wall,
        "ttft_p50_ms": percentile(stats.ttft_ms, 50),
        "ttft_p99_ms": percentile(stats.ttft_ms, 99),
        "gap_p50_ms": percentile(stats.gaps_ms, 50),
        "gap_p99_ms": percentile(stats.gaps_ms, 99),
        "client_cpu": cpu / wall,
    }


def histogram_quantiles(text: str, name: str, quantiles: tuple[float, ...]) -> list[float]:
    """Quantiles (ms) of a Prometheus histogram, interpolated linearly inside buckets (as histogram_quantile)."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                upper = float(sample.labels["le"])
                buckets[upper] = buckets.get(upper, 0.0) + sample.value
    bounds = sorted(buckets)
    total = buckets.get(float("inf"), 0.0)
    results = []
    for q in quantiles:
        if not total:
            results.append(0.0)
            continue
        rank, lower, below = q * total, 0.0, 0.0
        value = bounds[-2] if len(bounds) > 1 else 0.0
        for upper in bounds:
            count = buckets[upper]
            if count >= rank:
                if upper == float("inf"):
                    value = lower
                else:
                    value = lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
                break
            lower, below = upper, count
        results.append(value * 1000)
    return results


def bus_latency_delta(before: str, after: str) -> list[float]:
    """p50/p99 of the bus latency histogram over the traffic between two scrapes."""
    diff: dict[tuple[str, str], float] = {}
    for sign, text in ((-1, before), (1, after)):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "detok_bus_latency_seconds_bucket":
                    key = (sample.name, sample.labels["le"])
                    diff[key] = diff.get(key, 0.0) + sign * sample.value
    lines = [f'detok_bus_latency_seconds_bucket{{le="{le}"}} {value}' for (_, le), value in diff.items()]
    exposition = "# TYPE detok_bus_latency_seconds histogram\n" + "\n".join(lines) + "\n"
    return histogram_quantiles(exposition, "detok_bus_latency_seconds", (0.5, 0.99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--requests", type=int, default=2, help="streams per client, one after another")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--step-interval-ms",
        type=float,
        nargs="+",
        default=[0.0, 20.0],
        help="engine pacing, one server run each (0 = flat out: throughput; 20 = a model's inter-token time)",
    )
    parser.add_argument("--quick", action="store_true", help="50 clients, one stream each, 64 tokens")
    parser.add_argument("--json", default=None, help="result file (default bench/results/http.json)")
    parser.add_argument("--per-chunk", action="store_true", help="front CPU per chunk vs a bare uvicorn SSE server")
    parser.add_argument("--runs", type=int, default=3, help="--per-chunk: runs per client count (medians)")
    parser.add_argument("--http", default="httptools", help="--per-chunk: the bare server's uvicorn HTTP protocol")
    parser.add_argument("--fronts", type=int, default=1, help="--per-chunk: front processes (detok serve --fronts)")
    parser.add_argument(
        "--endpoint", default="completions", choices=["completions", "chat", "messages", "responses"],
        help="--per-chunk: the streaming API the clients call",
    )  # fmt: skip
    parser.add_argument("--request-cost", action="store_true", help="front CPU per 1-token chat completion")
    parser.add_argument("--prompt-chars", type=int, default=1024, help="--request-cost: the user message's size")
    parser.add_argument("--no-stream", action="store_true", help="--request-cost: whole answers, not SSE")
    parser.add_argument("--profile", action="store_true", help="--request-cost: py-spy the front in one more run")
    parser.add_argument("--profile-seconds", type=float, default=15.0)
    args = parser.parse_args()
    if args.request_cost:
        args.clients = [16] if args.clients == [100, 1000] else args.clients
        args.requests = 25 if args.requests == 2 else args.requests
        args.runs = 1 if args.quick else args.runs
        args.workers = 1 if args.workers == 2 else args.workers
    elif args.per_chunk:
        args.clients = [100] if args.quick else [500, 1500] if args.clients == [100, 1000] else args.clients
        args.step_interval_ms = [20.0] if args.step_interval_ms == [0.0, 20.0] else args.step_interval_ms
        args.runs = 1 if args.quick else args.runs
        args.max_tokens = 32 if args.quick else args.max_tokens
    elif args.quick:
        args.clients, args.requests, args.max_tokens, args.step_interval_ms = [50], 1, 64, [0.0]
    install_uvloop()

    print(machine_line())
    if args.request_cost:
        from request_cost import run_request_cost

        rows = run_request_cost(args)
        print(f"\nwrote {write_json('request_cost', {'prompt_chars': args.prompt_chars, 'rows': rows}, args.json)}")
        return
    if args.per_chunk:
        from http_per_chunk import run_per_chunk

        rows = run_per_chunk(args)
        print(f"\nwrote {write_json('http_per_chunk', {'max_tokens': args.max_tokens, 'rows': rows}, args.json)}")
        return
    print(
        f"detok serve: {args.workers} workers, corpus source; {args.requests} stream(s) per client, "
        f"max_tokens {args.max_tokens}\n"
    )
    rows = []
    for step_ms in args.step_interval_ms:
        serve_args = [
            "--workers",
            str(args.workers),
            "--step-interval-ms",
            str(step_ms),
            "--max-batch",
            str(max(args.clients) + 16),
            "--set",
            f"front.max_tokens_default={args.max_tokens}",
        ]
        with detok_serve(*serve_args) as url:
            model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
            asyncio.run(run_clients(url, model, 8, 1, 16))  # warm-up: connections, code paths
            for clients in args.clients:
                before = httpx.get(f"{url}/metrics").text
                row = asyncio.run(run_clients(url, model, clients, args.requests, args.max_tokens))
                after = httpx.get(f"{url}/metrics").text
                row["bus_p50_ms"], row["bus_p99_ms"] = bus_latency_delta(before, after)
                rows.append({"step_ms": step_ms, **row})
    columns = [
        ("step_ms", "engine step ms", "g"),
        ("clients", "clients", "d"),
        ("tokens_per_s", "tokens/s", ",.0f"),
        ("ttft_p50_ms", "TTFT p50", ".1f"),
        ("ttft_p99_ms", "TTFT p99", ".1f"),
        ("gap_p50_ms", "chunk gap p50", ".2f"),
        ("gap_p99_ms", "chunk gap p99", ".2f"),
        ("bus_p50_ms", "bus p50", ".2f"),
        ("bus_p99_ms", "bus p99", ".2f"),
        ("client_cpu", "client CPU", ".0%"),
        ("requests", "requests", "d"),
        ("errors", "errors", "d"),
    ]
    print_table(rows, columns)
    payload = {"workers": args.workers, "max_tokens": args.max_tokens, "requests_per_client": args.requests}
    print(f"\nwrote {write_json('http', {**payload, 'rows': rows}, args.json)}")


if __name__ == "__main__":
    main()
