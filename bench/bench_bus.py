"""Bus end to end: engine stub (flat out) -> ZMQ -> 1..N detok workers -> a front-side collector (no HTTP).

For each worker count, the same requests run twice: through detok's workers and through null workers that forward
ids without detokenizing (bench/null_worker.py: the transport limit). Reports delivered tokens/s, engine-to-front
latency p50/p99 per TextBatch, and detok as a fraction of the null run (target: >= 85% with 1 worker).
All processes share this machine's cores: the engine, the workers and this collector compete for them.

    python bench/bench_bus.py [--streams 256] [--tokens 2048] [--workers 1 2] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse

from bus_run import bench_config, prompt_ids_for, run_bus
from common import TOKENIZERS, load_tokenizer, machine_line, print_table, tokenizer_spec, write_json

TARGET = 0.85  # one detok worker's tokens/s as a share of the null worker's (no decoding) at least


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="qwen3", choices=sorted(TOKENIZERS))
    parser.add_argument("--streams", type=int, default=256, help="concurrent requests (engine.max_batch)")
    parser.add_argument("--tokens", type=int, default=2048, help="output tokens per request (before EOS)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--hwm", type=int, default=100, help="bus.high_water_mark (bounds queueing latency)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration, alternating; the best is kept")
    parser.add_argument("--quick", action="store_true", help="smaller run (64 streams x 256 tokens, 1 worker, once)")
    parser.add_argument("--json", default=None, help="result file (default bench/results/bus.json)")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.tokens, args.workers, args.repeats = 64, 256, [1], 1

    tokenizer = load_tokenizer(args.tokenizer)
    prompts, expected = prompt_ids_for(tokenizer, args.streams, args.tokens)
    print(machine_line())
    print(f"{args.tokenizer}: {args.streams} streams x {args.tokens} tokens (+EOS), engine flat out, hwm {args.hwm}\n")
    rows = []
    for workers in args.workers:
        config = bench_config(workers, args.streams, args.hwm, tokenizer_spec(args.tokenizer))
        best: dict[str, dict] = {}
        for _ in range(args.repeats):
            for null in (True, False):
                result = run_bus(config, prompts, None if null else expected, null=null).row()
                kind = result["worker_kind"]
                if kind not in best or result["tokens_per_s"] > best[kind]["tokens_per_s"]:
                    best[kind] = result
        null_rate = best["null"]["tokens_per_s"]
        for kind in ("null", "detok"):
            row = best[kind]
            row["vs_null"] = row["tokens_per_s"] / null_rate if null_rate else 0.0
            rows.append(row)
    columns = [
        ("worker_kind", "workers", ""),
        ("workers", "n", "d"),
        ("tokens_per_s", "tokens/s", ",.0f"),
        ("vs_null", "vs null", ".0%"),
        ("latency_p50_ms", "p50 ms", ".2f"),
        ("latency_p99_ms", "p99 ms", ".2f"),
        ("batches", "batches", "d"),
        ("engine_us", "engine us/tok", ".3f"),
        ("workers_us", "workers us/tok", ".3f"),
        ("collector_us", "collector us/tok", ".3f"),
        ("exact", "exact", "d"),
        ("finished", "finished", "d"),
    ]
    print_table(rows, columns)
    one = next((r for r in rows if r["worker_kind"] == "detok" and r["workers"] == 1), None)
    if one is not None:
        verdict = "holds" if one["vs_null"] >= TARGET else "MISSED"
        print(f"\ntarget: 1 detok worker >= {TARGET:.0%} of the null worker: {one['vs_null']:.0%} ({verdict})")
    path = write_json(
        "bus",
        {"tokenizer": args.tokenizer, "streams": args.streams, "tokens": args.tokens, "hwm": args.hwm, "rows": rows},
        args.json,
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
