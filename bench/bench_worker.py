"""The worker's whole per-batch path against tokenizers' DecodeStream per request.

What a worker does with one TokenBatch frame, minus the socket: the bus codec's decoding of the frame,
WorkerState.handle_batch (rid table lookup, decode, stop check, framing into a TextBatch) and the msgpack encoding of
that TextBatch and of any Finish. The
Opens of the requests are in the first TokenBatch and their cost is timed too (as creating the peer's streams is).
The peer: one `tokenizers.decoders.DecodeStream` per request, one step() per id, no stop check, no framing.

Same ids on both sides: N streams (default 256) of real text, one id per stream per engine step, EOS ids as stop
tokens; "2 stop strings" adds two per request that never occur in the text, so both cases process every id. The
last step carries finish "length" (the worker flushes). Each run's output is checked against decode() once.
Timing: CPU time of this process; --repeats rounds, each timing the worker then the peer, median per side and of
the per-round ratios. Llama-3.1's tokenizer (the llama3 fixture) is not redistributed with the repo: pass
`--restricted DIR` from `python tests/fixtures/tokenizers/build_fixtures.py --restricted DIR`; without it the
case runs on gpt4o (the nearest byte-level BPE fixture) and says so.

    python bench/bench_worker.py [--streams 256] [--tokens 512] [--repeats 5] [--restricted DIR] [--quick]
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from common import FIXTURES, corpus_ids, load_average, machine_line, make_streams, print_table, write_json  # noqa: E402
from core_variants import rust_tokenizer_for  # noqa: E402
from tokenizers.decoders import DecodeStream as RustDecodeStream  # noqa: E402

from detok_worker.bus.codec import encode, worker_decoder  # noqa: E402
from detok_worker.bus.columns import text_deltas, token_batch  # noqa: E402
from detok_worker.bus.messages import DetokParams, Open, TokenBatch, Tokens  # noqa: E402
from detok_worker.stream import byte_decoding_for  # noqa: E402
from detok_worker.tokenizer import create_tokenizer  # noqa: E402
from detok_worker.worker.state import WorkerState  # noqa: E402

TWO_STOPS = ("\n\nUser:", "</answer>")
TARGETS = {"stop tokens only": 5.0, "2 stop strings": 3.0}
Inputs = list[list[int]]


def tokenizer_cases(restricted: str | None) -> list[tuple[str, str]]:
    """(label, spec): Qwen3, and Llama-3.1 when its files are given, else gpt4o standing in for it."""
    from common import tokenizer_spec

    cases = [("qwen3", tokenizer_spec("qwen3"))]
    llama = Path(restricted) / "llama3" if restricted else None
    if llama is not None and llama.exists():
        cases.append(("llama-3.1 (llama3 fixture)", str(llama)))
    else:
        print("llama-3.1: not here (pass --restricted DIR); gpt4o stands in for it (nearest byte-level BPE)\n")
        cases.append(("gpt4o (for llama-3.1)", str(FIXTURES / "gpt4o")))
    return cases


def token_batches(inputs: Inputs, params: DetokParams) -> list[TokenBatch]:
    """The engine's view: the Opens, then one TokenBatch per step with one id per rid (in the batch's columns, as
    the engine sends them); the last step ends them."""
    rids = [f"r{index}" for index in range(len(inputs))]
    batches = [TokenBatch(0, 0, [Open(rid, [], params) for rid in rids], [])]
    last = len(inputs[0]) - 1
    for step in range(len(inputs[0])):
        finish = "length" if step == last else None
        items = [(rid, Tokens([ids[step]], finish)) for rid, ids in zip(rids, inputs, strict=True)]
        batches.append(token_batch(step + 1, 0, [], items))
    return batches


def run_worker(tokenizer: Any, frames: list[bytes], collect: dict[str, list[str]] | None) -> None:
    state = WorkerState(tokenizer, "bench")
    handle = state.handle_batch
    decode = worker_decoder().decode
    for frame in frames:
        result = handle(decode(frame))
        encode(result.text_batch)
        for finish in result.finishes:
            encode(finish)
        if collect is not None:
            for delta in text_deltas(result.text_batch):
                collect.setdefault(delta.rid, []).append(delta.text)


def run_decode_stream(rust: Any, inputs: Inputs) -> None:
    steps = [stream.step for stream in (RustDecodeStream(skip_special_tokens=False) for _ in inputs)]
    for t in range(len(inputs[0])):
        for step, ids in zip(steps, inputs, strict=True):
            step(rust, ids[t])


def cpu_seconds(run: Any) -> float:
    start = time.process_time()
    run()
    return max(time.process_time() - start, 1e-9)


def bench_case(label: str, tokenizer: Any, rust: Any, inputs: Inputs, stops: tuple[str, ...], repeats: int) -> dict:
    params = DetokParams(stop=list(stops), stop_token_ids=sorted(tokenizer.eos_token_ids))
    frames = [encode(batch) for batch in token_batches(inputs, params)]
    collected: dict[str, list[str]] = {}
    run_worker(tokenizer, frames, collected)
    exact = sum("".join(collected.get(f"r{i}", [])) == tokenizer.decode(ids) for i, ids in enumerate(inputs))
    worker_s, peer_s, ratios = [], [], []
    for _ in range(repeats):
        worker = cpu_seconds(lambda: run_worker(tokenizer, frames, None))
        peer = cpu_seconds(lambda: run_decode_stream(rust, inputs))
        worker_s.append(worker)
        peer_s.append(peer)
        ratios.append(peer / worker)
    tokens = sum(len(ids) for ids in inputs)
    return {
        "tokenizer": label,
        "stops": "2 stop strings" if stops else "stop tokens only",
        "worker_ns": statistics.median(worker_s) / tokens * 1e9,
        "peer_ns": statistics.median(peer_s) / tokens * 1e9,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "exact": exact,
        "streams": len(inputs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512, help="ids per stream")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per case (median reported)")
    parser.add_argument("--restricted", default=None, help="directory holding the llama3 fixture (see docstring)")
    parser.add_argument("--quick", action="store_true", help="64 streams x 128 ids, 3 rounds")
    parser.add_argument("--json", default=None, help="result file (default bench/results/worker.json)")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.tokens, args.repeats = 64, 128, 3
    print(machine_line())
    print(f"load average at start: {load_average()}")
    print(f"{args.streams} streams x {args.tokens} ids, 1 id per stream per step, {args.repeats} rounds\n")
    rows = []
    for label, spec in tokenizer_cases(args.restricted):
        tokenizer = create_tokenizer(spec)
        byte_decoding_for(tokenizer)  # the worker builds its tables at start-up, not in the first batch
        rust = rust_tokenizer_for(tokenizer)
        inputs = make_streams(corpus_ids(tokenizer), args.streams, args.tokens)
        for stops in ((), TWO_STOPS):
            rows.append(bench_case(label, tokenizer, rust, inputs, stops, args.repeats))
    load = load_average()
    columns = [
        ("tokenizer", "tokenizer", ""),
        ("stops", "stops", ""),
        ("worker_ns", "worker ns/token", ".0f"),
        ("peer_ns", "DecodeStream ns/token", ".0f"),
        ("ratio", "x (median)", ".2f"),
        ("ratio_min", "min", ".2f"),
        ("ratio_max", "max", ".2f"),
        ("exact", "exact", "d"),
    ]
    print_table(rows, columns)
    print(f"\nload average at end: {load}")
    for row in rows:
        target = TARGETS[row["stops"]]
        verdict = "holds" if row["ratio"] >= target else "MISSED"
        print(f"target {row['tokenizer']}, {row['stops']}: >= {target}x: {row['ratio']:.2f}x ({verdict})")
    path = write_json("worker", {"streams": args.streams, "tokens": args.tokens, "load": load, "rows": rows}, args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
