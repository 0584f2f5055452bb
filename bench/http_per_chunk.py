"""bench_http.py --per-chunk: the front's CPU per delivered SSE chunk against a bare uvicorn SSE server.

One `detok serve` (engine paced at --step-interval-ms) and one bench/bare_sse.py server, on the same uvicorn, loop
and HTTP implementation, serve the same load generator (bench/sse_client.py) in turn: C clients, each streaming
--requests completions of --max-tokens tokens. The bare server replays the exact SSE events the front sent for
CAPTURED such completions (the first request of as many clients), each request the next of them in turn, one text
event per engine step: the front's mix of stream lengths, so that both spread their per-request costs over alike
numbers of events. Per run, CPU seconds (utime + stime from /proc/PID/stat) of the front process, and of the bare
server, over the events the clients received; the ratio is front / bare.
Medians over --runs alternating runs; the load average is printed with each row. Also per run: SSE events per
stream (a front that falls behind coalesces text into fewer, bigger events) and the ratio per delivered token.
With --fronts N the front's CPU is summed over its N processes, and a second table gives each process's share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from common import HERE, REPO, cpu_seconds, load_average, print_table
from serve_proc import detok_serve, stop_child, wait_for_url
from sse_client import StreamStats, stream_completion

TARGET_RATIO = 1.3  # the front's CPU per chunk over the bare server's, at 400 clients


def _parent_of(pid: str) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def front_pids() -> list[int]:
    """The pids of the `detok_worker.cli front` processes among this process's descendants."""
    mine = {os.getpid()}
    candidates: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                candidates[int(entry)] = _parent_of(entry)
    for _ in range(4):  # bench -> serve -> front
        mine |= {pid for pid, parent in candidates.items() if parent in mine}
    fronts = []
    for pid in sorted(mine):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"detok_worker.cli" in argv and b"front" in argv:
                fronts.append(pid)
    if not fronts:
        raise RuntimeError("no front process found under this bench")
    return fronts


def completed_by_front(url: str, pids: list[int]) -> dict[int, int]:
    """Requests each front process has completed so far, from its own /stats: each GET opens a new connection,
    which SO_REUSEPORT hashes to one of the fronts, until every front has answered."""
    seen: dict[int, int] = {}
    for _ in range(200):
        front = httpx.get(f"{url}/stats", headers={"connection": "close"}).json()["front"]
        seen[front["pid"]] = front.get("completed", 0)
        if len(seen) == len(pids):
            return seen
    raise RuntimeError(f"/stats reached only fronts {sorted(seen)} of {pids}")


@contextlib.contextmanager
def bare_server(events_file: str, step_ms: float, http: str) -> Iterator[tuple[str, int]]:
    argv = [sys.executable, str(HERE / "bare_sse.py"), "--events", events_file, "--step-ms", str(step_ms)]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([*argv, "--http", http], cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            yield wait_for_url(proc, log, 30.0), proc.pid
        finally:
            stop_child(proc, signal.SIGINT, 10.0)


PATHS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
ENDPOINT = "completions"  # the API the clients call (--endpoint): set by run_per_chunk


def request_body(model: str, index: int, round_: int, max_tokens: int) -> bytes:
    text = f"Client {index} request {round_}: write something."
    usage = {"stream_options": {"include_usage": True}}
    chat = [{"role": "user", "content": text}]
    bodies = {
        "completions": {"prompt": text, "max_tokens": max_tokens, **usage},
        "chat": {"messages": chat, "max_tokens": max_tokens, **usage},
        "messages": {"messages": chat, "max_tokens": max_tokens},
        "responses": {"input": text, "max_output_tokens": max_tokens},
    }
    return json.dumps({"model": model, "stream": True, **bodies[ENDPOINT]}).encode()


async def load(url: str, model: str, clients: int, requests: int, max_tokens: int) -> tuple[StreamStats, float]:
    stats = StreamStats()
    path = PATHS[ENDPOINT]

    async def client_loop(index: int) -> None:
        for round_ in range(requests):
            await stream_completion(url, path, request_body(model, index, round_, max_tokens), stats)

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(index) for index in range(clients)))
    return stats, time.perf_counter() - start


def measure(url: str, pids: list[int], model: str, clients: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """One run against one server (its process(es) `pids`): CPU per delivered SSE event, in total and, for
    several front processes, per process (its events estimated from its share of the completed requests)."""
    fronts = len(pids) > 1
    completed_before = completed_by_front(url, pids) if fronts else {}
    cpu_before = {pid: cpu_seconds(pid) for pid in pids}
    stats, wall = asyncio.run(load(url, model, clients, requests, max_tokens))
    cpu = {pid: cpu_seconds(pid) - cpu_before[pid] for pid in pids}
    events, total_cpu = max(stats.events, 1), sum(cpu.values())
    row: dict[str, Any] = {
        "events": stats.events,
        "errors": stats.errors,
        "tokens_per_s": stats.tokens / wall,
        "cpu_us_per_chunk": total_cpu / events * 1e6,
        "cpu_us_per_token": total_cpu / max(stats.tokens, 1) * 1e6,
        "chunks_per_stream": stats.events / max(stats.requests, 1),
        "server_cpu": total_cpu / wall,
    }
    if fronts:
        completed_after = completed_by_front(url, pids)
        served = {pid: completed_after[pid] - completed_before.get(pid, 0) for pid in pids}
        total = max(sum(served.values()), 1)
        row["per_front"] = [
            {
                "pid": pid,
                "share": served[pid] / total,
                "tokens_per_s": stats.tokens / wall * served[pid] / total,
                "cpu": cpu[pid] / wall,
                "cpu_us_per_chunk": cpu[pid] / max(events * served[pid] / total, 1) * 1e6,
            }
            for pid in pids
        ]
    return row


CAPTURED = 64  # completions the bare server replays in turn


def capture_events(url: str, model: str, max_tokens: int) -> list[list[str]]:
    """The SSE events of the first completion of clients 0..CAPTURED-1, each as the front sent it."""
    captures: list[list[bytes]] = [[] for _ in range(CAPTURED)]

    async def capture_all() -> None:
        await asyncio.gather(
            *(
                stream_completion(url, PATHS[ENDPOINT], request_body(model, index, 0, max_tokens), StreamStats(), into)
                for index, into in enumerate(captures)
            )
        )

    asyncio.run(capture_all())
    return [[event.decode() + "\n\n" for event in captured] for captured in captures]


def run_per_chunk(args: Any) -> list[dict[str, Any]]:
    global ENDPOINT
    ENDPOINT = args.endpoint
    # the chat-shaped endpoints stream plain text (no reasoning parser), as completions do
    plain = [] if ENDPOINT == "completions" else ["--set", "front.reasoning_parser=none"]
    serve_args = [
        *plain,
        "--workers",
        str(args.workers),
        "--step-interval-ms",
        str(args.step_interval_ms[-1]),
        "--max-batch",
        str(max(args.clients) + 16),
        "--set",
        f"front.max_tokens_default={args.max_tokens}",
        "--fronts",
        str(args.fronts),
    ]
    step_ms = args.step_interval_ms[-1]
    print(
        f"per chunk ({ENDPOINT}): engine step {step_ms} ms, {args.fronts} front process(es) and one bare server on "
        f"uvicorn http={args.http}, {args.runs} runs\n"
    )
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
    loads: dict[int, list[str]] = {}
    with detok_serve(*serve_args) as url, tempfile.TemporaryDirectory() as tmp:
        pids = front_pids()
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        events_file = str(Path(tmp) / "events.json")
        Path(events_file).write_text(json.dumps(capture_events(url, model, args.max_tokens)))
        with bare_server(events_file, step_ms, args.http) as (bare_url, bare_pid):
            servers = {"front": (url, pids), "bare": (bare_url, [bare_pid])}
            for server_url, _ in servers.values():  # warm-up: connections, code paths
                asyncio.run(load(server_url, model, 8, 1, 16))
            for clients in args.clients:
                for _ in range(args.runs):
                    loads.setdefault(clients, []).append(load_average())
                    for name, (server_url, server_pids) in servers.items():
                        row = measure(server_url, server_pids, model, clients, args.requests, args.max_tokens)
                        samples.setdefault((name, clients), []).append(row)
    rows = [summary_row(clients, samples, loads[clients][0]) for clients in args.clients]
    columns = [
        ("clients", "clients", "d"),
        ("front_us", "front us/chunk", ".1f"),
        ("bare_us", "bare us/chunk", ".1f"),
        ("ratio", "front/bare", ".2f"),
        ("ratios", "per run", "s"),
        ("front_chunks", "front chunks/stream", ".1f"),
        ("bare_chunks", "bare chunks/stream", ".1f"),
        ("front_us_token", "front us/token", ".1f"),
        ("bare_us_token", "bare us/token", ".1f"),
        ("token_ratio", "front/bare per token", ".2f"),
        ("front_tps", "front tok/s", ",.0f"),
        ("bare_tps", "bare tok/s", ",.0f"),
        ("front_cpu", "front CPU", ".0%"),
        ("errors", "errors", "d"),
        ("load", "load 1/5/15", "s"),
    ]
    print_table(rows, columns)
    if args.fronts > 1:
        print("\nper front process (medians over runs; events estimated from each front's completed requests)")
        per_front = [front for row in rows for front in row["per_front"]]
        print_table(
            per_front,
            [
                ("clients", "clients", "d"),
                ("front", "front", "d"),
                ("share", "requests", ".0%"),
                ("tokens_per_s", "tok/s", ",.0f"),
                ("cpu", "CPU", ".0%"),
                ("cpu_us_per_chunk", "us/chunk", ".1f"),
            ],
        )
    for row in rows:
        verdict = "holds" if row["ratio"] <= TARGET_RATIO else "missed"
        print(f"target front <= {TARGET_RATIO}x bare at {row['clients']} clients: {verdict} ({row['ratio']:.2f}x)")
    return rows


def summary_row(clients: int, samples: dict[tuple[str, int], list[dict[str, Any]]], load: str) -> dict[str, Any]:
    """Medians over the runs at one client count; ratios per run (front and bare ran back to back)."""
    front, bare = samples[("front", clients)], samples[("bare", clients)]
    ratios = [f["cpu_us_per_chunk"] / b["cpu_us_per_chunk"] for f, b in zip(front, bare, strict=True)]
    token_ratios = [f["cpu_us_per_token"] / b["cpu_us_per_token"] for f, b in zip(front, bare, strict=True)]
    row: dict[str, Any] = {
        "clients": clients,
        "front_us": statistics.median(r["cpu_us_per_chunk"] for r in front),
        "bare_us": statistics.median(r["cpu_us_per_chunk"] for r in bare),
        "ratio": statistics.median(ratios),
        "ratios": " ".join(f"{ratio:.2f}" for ratio in ratios),
        "front_chunks": statistics.median(r["chunks_per_stream"] for r in front),
        "bare_chunks": statistics.median(r["chunks_per_stream"] for r in bare),
        "front_us_token": statistics.median(r["cpu_us_per_token"] for r in front),
        "bare_us_token": statistics.median(r["cpu_us_per_token"] for r in bare),
        "token_ratio": statistics.median(token_ratios),
        "front_tps": statistics.median(r["tokens_per_s"] for r in front),
        "bare_tps": statistics.median(r["tokens_per_s"] for r in bare),
        "front_cpu": statistics.median(r["server_cpu"] for r in front),
        "errors": sum(r["errors"] for r in front + bare),
        "load": load,
    }
    if "per_front" in front[0]:
        row["per_front"] = [
            {
                "clients": clients,
                "front": index,
                **{
                    key: statistics.median(r["per_front"][index][key] for r in front)
                    for key in ("share", "tokens_per_s", "cpu", "cpu_us_per_chunk")
                },
            }
            for index in range(len(front[0]["per_front"]))
        ]
    return row
