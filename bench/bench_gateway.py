"""Side by side with SMG: one gRPC engine (`detok engine-server`, corpus source, flat out unless --engine-step-ms,
Qwen3 tokenizer) behind (a) SMG (`smg launch --worker-urls grpc://...`, the Rust gateway) and (b) `detok serve
--source grpc` with 1 and 2 workers, under C concurrent streaming clients on /v1/completions and
/v1/chat/completions.

Each client streams requests one after another (enough for `--streams` streams per run), each with a unique key
in its prompt. The engine
server logs every request's prompt ids and the ids it streamed (--requests-log); after each run every client's
text is checked against the reference decode (HF `tokenizers`, skip_special_tokens) of exactly those ids, found by
the key in the decoded prompt: a difference prints MISMATCH and fails the bench. Reported per run: delivered
tokens/s (the ids the engine streamed), time to first token and the gap between text chunks at the client
(p50/p99), tokens per SSE chunk, and CPU seconds per 1000 delivered tokens of every process (from /proc: SMG's one
process; detok's front, engine (its gRPC gateway) and workers; the engine server; the load-generating client).
With --profile, one more detok run (not in the table) is recorded with py-spy on detok's front.

    python bench/bench_gateway.py [--clients 100 500 1500] [--streams 1500] [--max-tokens 64]
                                  [--systems smg detok-1 detok-2] [--endpoints completions chat]
                                  [--engine-step-ms 0] [--profile] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import cpu_seconds, machine_line, percentile, print_table, write_json
from gateway_procs import (
    MODEL,
    Service,
    profile_summary,
    running,
    start_detok,
    start_engine_server,
    start_profile,
    start_smg,
    wait_until_serving,
    write_tokenizer_dir,
)
from sse_client import StreamStats, install_uvloop, parse_stream, stream_completion
from tokenizers import Tokenizer

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
KEY = re.compile(r"bench-key-(\d+)")
RUN_TIMEOUT_S = 300.0
STREAM_TIMEOUT_S = 60
keys = itertools.count()


def request_body(endpoint: str, key: int, max_tokens: int) -> bytes:
    prompt = f"Write a short passage, please. bench-key-{key}"
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "stream": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return json.dumps(body).encode()


async def run_clients(
    url: str, endpoint: str, clients: int, requests: int, max_tokens: int
) -> tuple[StreamStats, dict[int, list[bytes]]]:
    stats = StreamStats()
    captures: dict[int, list[bytes]] = {}

    async def client_loop() -> None:
        for _ in range(requests):
            key = next(keys)
            captures[key] = []
            body = request_body(endpoint, key, max_tokens)
            try:
                await asyncio.wait_for(
                    stream_completion(url, PATHS[endpoint], body, stats, captures[key]), STREAM_TIMEOUT_S
                )
            except asyncio.TimeoutError:
                captures[key].append(b"failed: no end of stream in %d s" % STREAM_TIMEOUT_S)

    await asyncio.wait_for(asyncio.gather(*(client_loop() for _ in range(clients))), RUN_TIMEOUT_S)
    return stats, captures


class EngineRecords:
    """The engine server's requests log, read as it grows: key -> ids it streamed for that request."""

    def __init__(self, path: Path, reference: Tokenizer) -> None:
        self.path = path
        self.reference = reference
        self.offset = 0
        self.ids: dict[int, list[int]] = {}

    def collect(self, wanted: set[int], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with open(self.path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                match = KEY.search(self.reference.decode(record["prompt_ids"], skip_special_tokens=False))
                if match:
                    self.ids[int(match.group(1))] = record["ids"]
            if wanted <= self.ids.keys() or time.monotonic() > deadline:
                return
            time.sleep(0.1)


def check_exact(
    system: str, endpoint: str, captures: dict[int, list[bytes]], records: EngineRecords
) -> tuple[int, int, list[str]]:
    """(delivered tokens, mismatches, failure descriptions) of one run's streams."""
    records.collect(set(captures))
    tokens, mismatches, failures = 0, 0, []
    for key, events in captures.items():
        output = parse_stream(events)
        text, error = output.text, output.error
        ids = records.ids.get(key)
        if ids is None or error is not None:
            failures.append(f"{system} {endpoint} key {key}: {error or 'the engine never saw it'}")
            continue
        expected = records.reference.decode(ids, skip_special_tokens=True)
        tokens += len(ids)
        if text != expected:
            mismatches += 1
            at = len(os.path.commonprefix([text, expected]))
            kind = f"; the streamed text is a prefix, {expected[at:]!r} missing" if expected.startswith(text) else ""
            print(
                f"MISMATCH {system} {endpoint} key {key} at char {at}: "
                f"streamed {text[at : at + 30]!r} vs decode {expected[at : at + 30]!r}{kind}",
                file=sys.stderr,
            )
    return tokens, mismatches, failures


def measure(
    system: str, service: Service, url: str, engine: Service, records: EngineRecords, endpoint: str, clients: int,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    processes = {**service.processes(), "engine-server": engine.pid}
    cpu_before = {role: cpu_seconds(pid) for role, pid in processes.items()}
    client_before, wall_before = time.process_time(), time.perf_counter()
    requests = -(-args.streams // clients)
    stats, captures = asyncio.run(run_clients(url, endpoint, clients, requests, args.max_tokens))
    wall = time.perf_counter() - wall_before
    client_cpu = time.process_time() - client_before
    # a process restarted meanwhile (a worker declared dead) has no after-value: left out, and named in the row
    cpu = {
        role: cpu_seconds(pid) - cpu_before[role] for role, pid in processes.items() if Path(f"/proc/{pid}").exists()
    }
    tokens, mismatches, failures = check_exact(system, endpoint, captures, records)
    for failure in failures[:5]:
        print(f"FAILED {failure}", file=sys.stderr)
    per_1k = 1000 / max(tokens, 1)
    workers = sum(seconds for role, seconds in cpu.items() if role.startswith("worker"))
    gateway = sum(seconds for role, seconds in cpu.items() if role != "engine-server")
    chunks = len(stats.ttft_ms) + len(stats.gaps_ms)
    return {
        "system": system,
        "endpoint": endpoint,
        "clients": clients,
        "streams": len(captures),
        "tokens": tokens,
        "elapsed_s": round(wall, 3),
        "tokens_per_s": tokens / wall,
        "ttft_p50_ms": percentile(stats.ttft_ms, 50),
        "ttft_p99_ms": percentile(stats.ttft_ms, 99),
        "gap_p50_ms": percentile(stats.gaps_ms, 50),
        "gap_p99_ms": percentile(stats.gaps_ms, 99),
        "tokens_per_chunk": tokens / max(chunks, 1),
        "cpu_gateway": gateway * per_1k,
        "cpu_front": cpu.get("front", cpu.get("smg", 0.0)) * per_1k,
        "cpu_engine": cpu["engine"] * per_1k if "engine" in cpu else None,
        "cpu_workers": workers * per_1k if "engine" in cpu else None,
        "cpu_engine_server": cpu["engine-server"] * per_1k,
        "cpu_client": client_cpu * per_1k,
        "cpu_s": {role: round(seconds, 3) for role, seconds in cpu.items()},
        "restarted": sorted(processes.keys() - cpu.keys()),
        "mismatches": mismatches,
        "failed": len(failures) + stats.errors,
        "load_avg": os.getloadavg()[0],
    }


def start_system(system: str, engine_url: str, tokenizer_dir: Path, workdir: Path) -> tuple[Service, str]:
    if system == "smg":
        return start_smg(engine_url, tokenizer_dir, workdir)
    return start_detok(engine_url, tokenizer_dir, workdir, int(system.split("-")[1]))


def profile_detok(
    engine_url: str, tokenizer_dir: Path, workdir: Path, records: EngineRecords, args: argparse.Namespace
) -> list[str]:
    """py-spy on detok's front (1 worker) under the chat load of the largest client count."""
    clients = max(args.clients)
    service, url = start_detok(engine_url, tokenizer_dir, workdir, 1)
    with running(service):
        wait_until_serving(service, url)
        front = service.processes()["front"]
        out = workdir / "front.collapsed"
        profiler = start_profile(front, args.profile_seconds, out)
        time.sleep(0.5)
        requests = -(-args.streams // clients)  # about 10 s of load: the profile runs inside it
        _, captures = asyncio.run(run_clients(url, "chat", clients, requests, args.max_tokens))
        profiler.wait()
        check_exact("detok-1 (profiled)", "chat", captures, records)
    return [f"py-spy record on detok's front, chat, {clients} clients, 1 worker:", *profile_summary(out)]


COLUMNS = [
    ("system", "system", "s"),
    ("endpoint", "endpoint", "s"),
    ("clients", "clients", "d"),
    ("tokens_per_s", "tokens/s", ",.0f"),
    ("ttft_p50_ms", "TTFT p50", ".0f"),
    ("ttft_p99_ms", "TTFT p99", ".0f"),
    ("gap_p50_ms", "gap p50", ".1f"),
    ("gap_p99_ms", "gap p99", ".1f"),
    ("tokens_per_chunk", "tok/chunk", ".1f"),
    ("cpu_gateway", "CPU gw", ".2f"),
    ("cpu_front", "front|smg", ".2f"),
    ("cpu_engine", "engine", ".2f"),
    ("cpu_workers", "workers", ".2f"),
    ("cpu_engine_server", "engine srv", ".2f"),
    ("cpu_client", "client", ".2f"),
    ("mismatches", "mismatch", "d"),
    ("failed", "failed", "d"),
    ("load_avg", "load", ".1f"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 500, 1500])
    parser.add_argument("--streams", type=int, default=1500, help="streams per run at least (clients x requests)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--systems", nargs="+", default=["smg", "detok-1", "detok-2"])
    parser.add_argument("--endpoints", nargs="+", choices=sorted(PATHS), default=["completions", "chat"])
    parser.add_argument(
        "--engine-step-ms", type=float, default=0.0, help="the engine server's pace: one id per chunk this often"
    )
    parser.add_argument("--profile", action="store_true", help="py-spy detok's front in one more run")
    parser.add_argument("--profile-seconds", type=float, default=8.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 50 clients, 32 tokens")
    parser.add_argument("--json", default=None, help="result file (default bench/results/gateway.json)")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.max_tokens, args.streams = [50], 32, 50
    install_uvloop()

    print(machine_line())
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs = f"{args.streams}+ streams per run, max_tokens {args.max_tokens}"
    print(f"{runs}; engine step {args.engine_step_ms} ms\n")
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    profile: list[str] = []
    with tempfile.TemporaryDirectory(prefix="detok-bench-gateway-") as tmp:
        workdir = Path(tmp)
        tokenizer_dir = write_tokenizer_dir(workdir)
        records = EngineRecords(workdir / "requests.jsonl", Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")))
        engine, engine_url = start_engine_server(tokenizer_dir, workdir, args.engine_step_ms)
        with running(engine):
            for system in args.systems:
                service, url = start_system(system, engine_url, tokenizer_dir, workdir)
                with running(service):
                    wait_until_serving(service, url)
                    asyncio.run(run_clients(url, "chat", 16, 1, 16))  # warm-up: connections, code paths
                    for endpoint in args.endpoints:
                        for clients in args.clients:
                            rows.append(measure(system, service, url, engine, records, endpoint, clients, args))
                            print(f"  {system} {endpoint} {clients}: {rows[-1]['tokens_per_s']:,.0f} tok/s", flush=True)
            if args.profile:
                profile = profile_detok(engine_url, tokenizer_dir, workdir, records, args)
    print()
    print_table(rows, COLUMNS)
    print("\nCPU columns: seconds per 1000 delivered tokens; gw = every process of the gateway (SMG: its one process)")
    if profile:
        print("\n" + "\n".join(profile))
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"total {time.monotonic() - started:.0f} s")
    payload = {
        "max_tokens": args.max_tokens,
        "streams_per_run": args.streams,
        "engine_step_ms": args.engine_step_ms,
    }
    print(f"wrote {write_json('gateway', {**payload, 'rows': rows, 'profile': profile}, args.json)}")
    bad = sum(row["mismatches"] for row in rows)
    if bad:
        print(f"\nMISMATCH: {bad} stream(s) differ from the decode of the engine's ids", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
