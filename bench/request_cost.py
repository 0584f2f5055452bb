"""bench_http.py --request-cost: a request's fixed cost in the front. C clients send 1-token chat completions (a
user message of --prompt-chars characters of corpus text, a different one per request, streamed by default) to a
`detok serve` whose engine runs flat out, one after another on each client; per run, the front process's CPU
seconds (utime + stime from /proc/PID/stat) per completed request and completed requests per second. The front
shares the machine with the engine, the workers and this load generator: requests/s is what this machine gives,
the CPU per request says what one front process can do when it has a core (1 / CPU per request). Medians over
--runs; the load average is printed with each row.

    python bench/bench_http.py --request-cost [--clients 16] [--runs 3] [--requests 25] [--prompt-chars 1024]
                               [--no-stream] [--profile] (--requests: per client and run)

--profile: one more run with py-spy sampling the front (gateway_procs.start_profile), its top frames printed.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import corpus_text, cpu_seconds, load_average, print_table
from gateway_procs import profile_summary, start_profile
from http_per_chunk import front_pids
from serve_proc import detok_serve
from sse_client import StreamStats, stream_completion


def chat_bodies(model: str, count: int, prompt_chars: int, stream: bool) -> list[bytes]:
    """`count` 1-token chat requests, each a user message of `prompt_chars` characters from its own corpus offset."""
    text = corpus_text()
    bodies = []
    for index in range(count):
        start = (index * 7919) % max(1, len(text) - prompt_chars)
        message = {"role": "user", "content": text[start : start + prompt_chars]}
        body = {"model": model, "messages": [message], "max_tokens": 1, "stream": stream}
        bodies.append(json.dumps(body).encode())
    return bodies


async def send_all(url: str, bodies: list[bytes], clients: int) -> tuple[StreamStats, float]:
    stats = StreamStats()
    queue = list(reversed(bodies))

    async def client() -> None:
        while queue:
            await stream_completion(url, "/v1/chat/completions", queue.pop(), stats)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return stats, time.perf_counter() - start


def measure(url: str, pid: int, bodies: list[bytes], clients: int) -> dict[str, Any]:
    before = cpu_seconds(pid)
    stats, wall = asyncio.run(send_all(url, bodies, clients))
    cpu = cpu_seconds(pid) - before
    done = max(stats.requests, 1)
    return {
        "us_per_request": cpu / done * 1e6,
        "requests_per_s": stats.requests / wall,
        "front_cpu": cpu / wall,
        "errors": stats.errors,
    }


def run_request_cost(args: Any) -> list[dict[str, Any]]:
    stream = not args.no_stream
    clients = args.clients[0]
    count = clients * args.requests
    serve_args = ["--workers", str(args.workers), "--step-interval-ms", "0", "--max-batch", str(clients + 16)]
    print(
        f"request cost: 1-token chat completions ({'streamed' if stream else 'whole'}), {args.prompt_chars}-character "
        f"user message, {clients} clients, {count} requests a run, {args.runs} runs\n"
    )
    rows = []
    with detok_serve(*serve_args) as url:
        (pid,) = front_pids()
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        bodies = chat_bodies(model, count, args.prompt_chars, stream)
        asyncio.run(send_all(url, bodies[:64], clients))  # warm-up: connections, code paths
        for run in range(args.runs):
            rows.append({"run": run, "load": load_average(), **measure(url, pid, bodies, clients)})
        profile = profile_run(url, pid, bodies, clients, args.profile_seconds) if args.profile else []
    columns = [
        ("run", "run", "d"),
        ("us_per_request", "front us/request", ".0f"),
        ("requests_per_s", "requests/s", ",.0f"),
        ("front_cpu", "front CPU", ".0%"),
        ("errors", "errors", "d"),
        ("load", "load 1/5/15", "s"),
    ]
    print_table(rows, columns)
    median_us = statistics.median(row["us_per_request"] for row in rows)
    median_rps = statistics.median(row["requests_per_s"] for row in rows)
    print(
        f"\nmedian: front {median_us:.0f} us per request ({1e6 / median_us:,.0f} requests/s per front core), "
        f"{median_rps:,.0f} requests/s measured"
    )
    print("\n".join(profile))
    return rows


def profile_run(url: str, pid: int, bodies: list[bytes], clients: int, seconds: float) -> list[str]:
    """More runs, the front sampled by py-spy for `seconds`; the profile's top frames."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "front.collapsed"
        profiler = start_profile(pid, seconds, out)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            asyncio.run(send_all(url, bodies, clients))
        profiler.wait()
        return ["", "front profile (py-spy):", *profile_summary(out, top=25)] if out.is_file() else ["(no profile)"]
