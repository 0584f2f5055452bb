"""Side by side on a real vLLM engine: one engine config (vLLM 0.32 on CPU, the tests' random-weight Qwen3:
tests/helpers/vllm_cpu.py) behind four front ends, one after another, each with its own engine core:
  vllm        vLLM's own OpenAI server (`vllm serve MODEL FLAGS`)
  smg         `vllm serve --grpc` + SMG (`smg launch --worker-urls grpc://...`)
  detok-grpc  `vllm serve --grpc` + `detok serve --source grpc --engine-url grpc://...`
  detok-vllm  `detok serve --source vllm --model MODEL -- FLAGS` (detok's engine process is vLLM's front-end client)

Each run: C concurrent clients, one streaming /v1/completions request each (`ignore_eos`, `max_tokens`, temperature
1 with the client's own seed: the same request gives the same ids in every system). Reported per run (and as the
medians of the repeats): delivered tokens/s, TTFT and inter-chunk gap p50/p99 at the client, tokens per text
chunk, and CPU seconds per 1000 delivered tokens of every front-side process (from /proc, before and after the
load window): vLLM's API or gRPC server process, SMG, detok's supervisor, front, engine process and workers;
vLLM's engine core and model worker (busy-polling, pinned) are reported apart, never in the front side.

Exactness: after its measured runs, vLLM's own server answers each level's requests once more with
`return_token_ids` (not timed); its text is checked against HF `tokenizers`' decode of those ids, and every
system's streamed texts are compared with both that text and that decode. Expected differences: where an output
ends inside a character the full decode (and detok) end with U+FFFD and vLLM's server drops the unfinished
character; anything else is counted as "other". Without the vllm system, the reference comes from the last run
that had it (bench/results/vllm-reference.json).

    python bench/bench_vllm.py [--clients 200 1000] [--max-tokens 128] [--repeats 3]
                               [--systems vllm smg detok-grpc detok-vllm] [--workers 2] [--profile] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, cpu_seconds, load_average, machine_line, percentile, print_table, write_json
from gateway_procs import MODEL, profile_summary, start_profile
from sse_client import StreamOutput, StreamStats, install_uvloop, parse_stream, stream_completion
from tokenizers import Tokenizer
from vllm_exact import EXACT_COLUMNS, Reference, check_exact, load_reference, save_reference
from vllm_procs import (
    API_SERVER_TITLE,
    DESCRIPTIONS,
    SYSTEMS,
    System,
    engine_flags,
    running_system,
    tokenizer_vocab,
    vllm_cpu,
)

PATH = "/v1/completions"


def request_body(seed: int, max_tokens: int, with_ids: bool) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL, "prompt": f"Story number {seed}:", "max_tokens": max_tokens, "temperature": 1.0,
        "seed": seed, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    if with_ids:
        body["return_token_ids"] = True
    return json.dumps(body).encode()


async def run_clients(
    url: str, clients: int, max_tokens: int, timeout_s: float, with_ids: bool = False
) -> tuple[StreamStats, dict[int, StreamOutput]]:
    """One streaming request per client (seeds 1..clients), all at once; each stream's output by seed."""
    stats = StreamStats()
    captures: dict[int, list[bytes]] = {seed: [] for seed in range(1, clients + 1)}

    async def client(seed: int) -> None:
        body = request_body(seed, max_tokens, with_ids)
        try:
            await asyncio.wait_for(stream_completion(url, PATH, body, stats, captures[seed]), timeout_s)
        except asyncio.TimeoutError:
            captures[seed].append(b"failed: no end of stream in %d s" % timeout_s)

    await asyncio.gather(*(client(seed) for seed in captures))
    return stats, {seed: parse_stream(events) for seed, events in captures.items()}


def group(role: str) -> str:
    """Which column a front-side process's CPU goes to."""
    if role.startswith(("vllm-api", "vllm-grpc", API_SERVER_TITLE)):
        return "vllm"
    if role.startswith("worker"):
        return "detok_workers"
    if role.split()[0] in ("front", "engine", "serve"):
        return f"detok_{role.split()[0]}"
    return "smg" if role == "smg" else "other"


def measure(system: System, clients: int, repeat: int, args: argparse.Namespace) -> tuple[dict, dict]:
    front, engine = system.front_side()
    processes = {**front, **engine}
    before = {role: cpu_seconds(pid) for role, pid in processes.items()}
    client_before, wall_before, load_before = time.process_time(), time.perf_counter(), os.getloadavg()[0]
    stats, outputs = asyncio.run(run_clients(system.url, clients, args.max_tokens, args.timeout))
    wall = time.perf_counter() - wall_before
    client_cpu = time.process_time() - client_before
    cpu = {role: cpu_seconds(pid) - before[role] for role, pid in processes.items()}
    for seed, output in [(seed, output) for seed, output in outputs.items() if output.error][:3]:
        print(f"FAILED {system.name} {clients} seed {seed}: {output.error[:300]}", file=sys.stderr)
    per_1k = 1000 / max(stats.tokens, 1)
    groups: dict[str, float] = {}
    for role in front:
        groups[group(role)] = groups.get(group(role), 0.0) + cpu[role] * per_1k
    row = {
        "system": system.name, "clients": clients, "repeat": repeat, "tokens": stats.tokens,
        "elapsed_s": round(wall, 3), "tokens_per_s": stats.tokens / wall,
        "ttft_p50_ms": percentile(stats.ttft_ms, 50), "ttft_p99_ms": percentile(stats.ttft_ms, 99),
        "gap_p50_ms": percentile(stats.gaps_ms, 50), "gap_p99_ms": percentile(stats.gaps_ms, 99),
        "tokens_per_chunk": stats.tokens / max(len(stats.ttft_ms) + len(stats.gaps_ms), 1),
        "cpu_front_side": sum(cpu[role] for role in front) * per_1k,
        **{f"cpu_{name}": seconds for name, seconds in groups.items()},
        "cpu_engine_core": sum(cpu[role] for role in engine) * per_1k, "cpu_client": client_cpu * per_1k,
        "cpu_s": {role: round(seconds, 3) for role, seconds in cpu.items()},
        "failed": sum(output.error is not None for output in outputs.values()),
        "short": sum(1 for output in outputs.values() if output.error is None) * args.max_tokens - stats.tokens,
        "load_before": load_before, "load_after": os.getloadavg()[0],
    }  # fmt: skip
    if system.name.startswith("detok"):  # workers the engine declared lost since the start: must stay 0
        with urllib.request.urlopen(f"{system.url}/stats", timeout=10) as response:
            row["lost_workers"] = json.loads(response.read())["engine"].get("lost_workers", 0)
    if args.model_free_step_ms:  # what the paced engine produces when every stream runs at once
        row["offered_tokens_per_s"] = min(clients, args.max_num_seqs) * 1000 / args.model_free_step_ms
        row["delivered_share"] = row["tokens_per_s"] / row["offered_tokens_per_s"]
    return row, outputs


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (system, clients): the median of every number over the repeats."""
    keyed: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        keyed.setdefault((row["system"], row["clients"]), []).append(row)
    out = []
    for (system, clients), runs in keyed.items():
        merged: dict[str, Any] = {"system": system, "clients": clients, "repeats": len(runs)}
        for key, value in runs[0].items():
            if key not in merged and isinstance(value, (int, float)) and key != "repeat":
                merged[key] = statistics.median(run.get(key, 0) for run in runs)
        merged["failed"] = sum(run["failed"] for run in runs)
        out.append(merged)
    return out


def reference_pass(system: System, clients: int, args: argparse.Namespace, decoder: Tokenizer) -> dict[int, Any]:
    """vLLM's own server's text and ids of each client's request at this level (not timed)."""
    _, outputs = asyncio.run(run_clients(system.url, clients, args.max_tokens, args.timeout, with_ids=True))
    bad = [seed for seed, output in outputs.items() if output.error or len(output.token_ids) != args.max_tokens]
    if bad:
        first = outputs[bad[0]]
        print(
            f"reference pass at {clients}: {len(bad)} stream(s) failed or short, e.g. seed {bad[0]}: "
            f"{len(first.token_ids)} ids, error {first.error}",
            file=sys.stderr,
        )
    return {seed: output for seed, output in outputs.items() if seed not in bad}


def profile_detok(system: System, args: argparse.Namespace, workdir: Path) -> list[str]:
    """py-spy on detok's front and engine process during one more run at the largest level (not in the table)."""
    front, _ = system.front_side()
    profilers = {role: workdir / f"{role}.collapsed" for role in ("front", "engine")}
    started = [start_profile(front[role], args.profile_seconds, out) for role, out in profilers.items()]
    time.sleep(0.5)
    asyncio.run(run_clients(system.url, max(args.clients), args.max_tokens, args.timeout))
    for profiler in started:
        profiler.wait()
    lines = []
    for role, out in profilers.items():
        lines.append(f"py-spy record, detok-vllm {role}, {max(args.clients)} clients:")
        lines += profile_summary(out, package=f"detok_worker/{role}/") if out.is_file() else ["  (no profile)"]
    return lines


COLUMNS = [
    ("system", "system", "s"),
    ("clients", "clients", "d"),
    ("tokens_per_s", "tokens/s", ",.0f"),
    ("offered_tokens_per_s", "offered", ",.0f"),
    ("ttft_p50_ms", "TTFT p50", ".0f"),
    ("ttft_p99_ms", "TTFT p99", ".0f"),
    ("gap_p50_ms", "gap p50", ".1f"),
    ("gap_p99_ms", "gap p99", ".1f"),
    ("tokens_per_chunk", "tok/chunk", ".1f"),
    ("cpu_front_side", "front side", ".3f"),
    ("cpu_vllm", "vLLM srv", ".3f"),
    ("cpu_smg", "SMG", ".3f"),
    ("cpu_detok_serve", "d.serve", ".3f"),
    ("cpu_detok_front", "d.front", ".3f"),
    ("cpu_detok_engine", "d.engine", ".3f"),
    ("cpu_detok_workers", "d.workers", ".3f"),
    ("cpu_engine_core", "engine core", ".3f"),
    ("cpu_client", "client", ".3f"),
    ("failed", "failed", "d"),
    ("lost_workers", "lost w.", "d"),
    ("load_before", "load", ".1f"),
]


def verdict(table: list[dict[str, Any]]) -> list[str]:
    """detok-vllm's front side and tokens/s against vLLM's own server and against vllm --grpc + SMG."""
    by = {(row["system"], row["clients"]): row for row in table}
    lines = []
    for (system, clients), row in by.items():
        if system != "detok-vllm":
            continue
        for peer, target in (("vllm", 0.7), ("smg", 0.5)):
            other = by.get((peer, clients))
            if other is None:
                continue
            ratio = row["cpu_front_side"] / max(other["cpu_front_side"], 1e-9)
            speed = row["tokens_per_s"] / max(other["tokens_per_s"], 1e-9)
            holds = "holds" if ratio <= target and speed >= 1 else "misses"
            lines.append(
                f"{clients} clients: detok-vllm front side {ratio:.2f}x {peer}'s (target <= {target}x), "
                f"tokens/s {speed:.2f}x: {holds}"
            )
    return lines


class Bench:
    """One bench run: every system in turn, its rows, how exact its texts were, and vLLM's reference."""

    def __init__(self, args: argparse.Namespace, model: Path, workdir: Path) -> None:
        self.args = args
        self.model = model
        self.workdir = workdir
        self.flags = engine_flags(args.max_num_seqs, args.max_num_batched_tokens) + args.engine_flag
        self.env: dict[str, str] = {}
        if args.model_free_step_ms is not None:
            self.flags += ["--worker-cls", vllm_cpu.MODEL_FREE_WORKER]
            self.env[vllm_cpu.MODEL_FREE_STEP_ENV] = str(args.model_free_step_ms)
        self.decoder = Tokenizer.from_file(str(model / "tokenizer.json"))
        # the model-free worker's ids are not the model's: its reference is kept apart
        self.ids_from = args.vocab if args.model_free_step_ms is None else f"{args.vocab}, model-free"
        self.reference: Reference = {} if "vllm" in args.systems else load_reference(args.max_tokens, self.ids_from)
        self.rows: list[dict[str, Any]] = []
        self.exact: list[dict[str, Any]] = []
        self.profile: list[str] = []

    def run_system(self, name: str) -> None:
        args = self.args
        print(f"{name}: {DESCRIPTIONS[name]}", flush=True)
        outputs: dict[int, list[dict[int, StreamOutput]]] = {}
        with running_system(name, self.model, self.flags, self.workdir, args.workers, self.env) as system:
            asyncio.run(run_clients(system.url, 16, 16, args.timeout))  # warm-up: connections, code paths
            for clients in args.clients:
                for repeat in range(args.repeats):
                    row, run_outputs = measure(system, clients, repeat, args)
                    self.rows.append(row)
                    outputs.setdefault(clients, []).append(run_outputs)
                    print(f"  {clients} clients #{repeat + 1}: {row['tokens_per_s']:,.0f} tok/s, front side "
                          f"{row['cpu_front_side']:.3f} s/1k, failed {row['failed']}", flush=True)  # fmt: skip
                    if row["failed"]:
                        self.keep_logs(f"{name}-{clients}-{repeat + 1}")
                    self.save(complete=False)
                if name == "vllm":
                    self.reference[clients] = reference_pass(system, clients, args, self.decoder)
            if args.profile and name == "detok-vllm":
                self.profile = profile_detok(system, args, self.workdir)
        if name == "vllm":
            self.check_reference()
        for clients, runs in outputs.items():
            counts: dict[str, int] = {}
            for run_outputs in runs:
                for key, n in check_exact(name, clients, run_outputs, self.reference, self.decoder).items():
                    counts[key] = counts.get(key, 0) + n
            self.exact.append({"system": name, "clients": clients, **counts})
        self.save(complete=False)

    def keep_logs(self, run: str) -> None:
        """A run with failed streams: its services' logs so far are copied out of the temp dir, to find why."""
        target = RESULTS_DIR / f"vllm-failed-{run}-{time.strftime('%H%M%S')}"
        target.mkdir(parents=True, exist_ok=True)
        for log_file in self.workdir.glob("*.log"):
            shutil.copy(log_file, target / log_file.name)
        print(f"  logs of the failed run kept in {target}", flush=True)

    def check_reference(self) -> None:
        """vLLM's reference texts against the decode of their own ids, kept on disk at once for runs without
        vLLM's server."""
        save_reference(self.args.max_tokens, self.ids_from, self.reference)
        self.exact += [
            {"system": "vllm (ids pass)", "clients": clients,
             **check_exact("vllm-ids", clients, level, {clients: level}, self.decoder)}
            for clients, level in self.reference.items()
        ]  # fmt: skip

    def save(self, complete: bool) -> Path:
        """The result file; written after every run too (complete: false), so a run cut short keeps its rows."""
        args = self.args
        table = medians(self.rows)
        payload = {"complete": complete, "max_tokens": args.max_tokens, "repeats": args.repeats, "vocab": self.ids_from}
        payload["model_free_step_ms"] = args.model_free_step_ms
        payload |= {"engine_flags": self.flags, "workers": args.workers, "medians": table, "rows": self.rows}
        payload |= {"exactness": self.exact, "verdict": verdict(table), "profile": self.profile}
        return write_json("vllm", {**payload, "load_now": load_average()}, args.json)

    def report(self) -> None:
        table = medians(self.rows)
        print()
        print_table(table, COLUMNS)
        print("\nCPU columns: seconds per 1000 delivered tokens, medians of the repeats; front side = every process")
        print("but vLLM's engine core and model worker (column 'engine core'); load = 1-min load average at the start")
        print("\nexactness (streams of all repeats; 'vs decode' = HF tokenizers' decode of vLLM's ids):")
        print_table(self.exact, EXACT_COLUMNS)
        print("\n" + "\n".join(verdict(table) + self.profile))
        print(f"wrote {self.save(complete=True)}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[200, 1000], help="concurrency levels")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="runs per level (the table shows medians)")
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--workers", type=int, default=2, help="detok workers (both detok systems)")
    parser.add_argument("--max-num-seqs", type=int, default=512, help="vLLM's engine flag, the same everywhere")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=8192,
        help="vLLM's step token budget (its CPU default, 2048, splits prompts when ~300 requests arrive at once)",
    )  # fmt: skip
    parser.add_argument(
        "--vocab", choices=("model", "tokenizer"), default="model",
        help="the model's vocabulary: Qwen3's 151936 ids (the tests' config) or the tokenizer's 151669",
    )  # fmt: skip
    parser.add_argument(
        "--engine-flag", action="append", default=[], metavar="FLAG",
        help="one more `vllm serve` flag for every system, e.g. --engine-flag=--disable-log-stats (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--model-free-step-ms", type=float, default=None, metavar="MS",
        help="run every engine core on engine_stub's model-free vLLM worker with this step time (0: unpaced): "
        "vLLM's own scheduler and wire at GPU token rates; the offered rate is clients x 1000 / MS tokens/s",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run's streams may take")
    parser.add_argument("--profile", action="store_true", help="py-spy detok-vllm's front and engine in one more run")
    parser.add_argument("--profile-seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 clients, 16 tokens, 1 repeat")
    parser.add_argument("--json", default=None, help="result file (default bench/results/vllm.json)")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.max_tokens, args.repeats = [20], 16, 1
    return args


def stop_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM ends the bench like Ctrl-C: the running system's processes are stopped on the way out."""
    raise SystemExit(128 + signum)


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, stop_on_signal)
    install_uvloop()
    print(machine_line())
    print(f"load average at start: {load_average()}")
    started = time.monotonic()
    model = vllm_cpu.model_dir()
    if args.vocab == "tokenizer":
        print(f"model vocabulary: {tokenizer_vocab(model)} ids (the tokenizer's)")
    try:
        with tempfile.TemporaryDirectory(prefix="detok-bench-vllm-") as tmp:
            bench = Bench(args, model, Path(tmp))
            print(f"engine flags: {' '.join(bench.flags)}; max_tokens {args.max_tokens}, {args.repeats} repeat(s)\n")
            for name in args.systems:
                bench.run_system(name)
    finally:
        shutil.rmtree(model, ignore_errors=True)
    bench.report()
    print(f"load average at end: {load_average()}; total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
