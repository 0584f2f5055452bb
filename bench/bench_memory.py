"""Worker memory per live request: bytes of WorkerState per open rid after short and 32k-token requests.

For each tokenizer family, N rids are opened in a WorkerState (the worker's pure core: rid table, stream and stop
decoder) and fed their output ids through handle_batch (TokenBatches, as the engine sends them) without ending
them; tracemalloc measures what the state holds afterwards (after a gc), divided by N. Invariant 4 of the design:
this must not grow with request length, so the short and long columns should match. Shared caches (per-tokenizer
tables, per-stop-set automata and their scan memo, bounded by their own limits) are built by a warm-up run first;
the growth of the stop-string scan memo during the measured run is reported apart. The generic window-diff
DecodeStream (used for tokenizers without a verified byte table) is measured on its own too. The ~100 bytes a long
request holds more than a short one are its counters (offsets, token counts) growing past CPython's cached small
ints: constant, whatever the length.

    python bench/bench_memory.py [--rids 32] [--short 16] [--long 32768] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

from common import (
    TOKENIZERS,
    available_families,
    corpus_ids,
    load_tokenizer,
    machine_line,
    make_streams,
    print_table,
    write_json,
)

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, TokenBatch, Tokens
from detok_worker.stream import DecodeStream, byte_decoding_for
from detok_worker.worker.state import WorkerState

FOUR_STOPS = ["\n\nUser:", "</answer>", "###", "Observation:"]
CHUNK = 16  # ids per Tokens item (the state does not depend on how ids are batched; fewer batches run faster)


SHARED_CACHE_FILES = ("stop_matcher.py",)  # per-automaton scan memo and compiled automata: shared, bounded
TRACE_FILTERS = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib*")]


def traced_bytes(build: Callable[[], Any]) -> tuple[int, int]:
    """(bytes build() leaves allocated outside the shared caches, bytes the shared caches grew by). Only what is
    allocated while build() runs is traced (tracing the tokenizer's tables too would make snapshots slow)."""
    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.take_snapshot().filter_traces(TRACE_FILTERS)
    kept = build()
    gc.collect()
    after = tracemalloc.take_snapshot().filter_traces(TRACE_FILTERS)
    tracemalloc.stop()
    own = shared = 0
    for stat in after.compare_to(before, "filename"):
        filename = stat.traceback[0].filename
        if filename.endswith(SHARED_CACHE_FILES):
            shared += stat.size_diff
        else:
            own += stat.size_diff
    del kept
    return own, shared


def worker_state_bytes(tokenizer: Any, streams: list[list[int]], stops: list[str]) -> tuple[float, int]:
    """(bytes per live rid, growth of the shared stop-string caches during the run)."""
    eos = sorted(tokenizer.eos_token_ids)
    params = DetokParams(stop=stops, stop_token_ids=eos)

    def build() -> WorkerState:
        state = WorkerState(tokenizer, "bench")
        opens = [Open(f"rid-{index}", ids[:8], params) for index, ids in enumerate(streams)]
        state.handle_batch(TokenBatch(0, 0, opens, []))
        for position in range(0, len(streams[0]), CHUNK):
            items = [(f"rid-{index}", Tokens(ids[position : position + CHUNK])) for index, ids in enumerate(streams)]
            batch = token_batch(position + 1, 0, [], items)
            ended = [d for d in text_deltas(state.handle_batch(batch).text_batch) if d.finish]
            if ended:
                raise RuntimeError(f"a benchmark request ended early at token {position}: {ended[0]}")
        return state

    build()  # warm-up: per-tokenizer tables and per-stop-set automata are built once per worker, not per rid
    own, shared = traced_bytes(build)
    return own / len(streams), shared


def generic_stream_bytes(tokenizer: Any, streams: list[list[int]]) -> float:
    def build() -> list[DecodeStream]:
        decoders = [DecodeStream(tokenizer, ids[:8], force_generic=True) for ids in streams]
        for position in range(0, len(streams[0]), CHUNK):
            for decoder, ids in zip(decoders, streams, strict=True):
                decoder.step_batch(ids[position : position + CHUNK])
        return decoders

    build()
    own, _ = traced_bytes(build)
    return own / len(streams)


def avoid_stops(streams: list[list[int]], tokenizer: Any) -> None:
    text = tokenizer.decode(streams[0])
    assert not any(stop in text for stop in FOUR_STOPS), "a benchmark stop string occurs in the text"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizers", nargs="+", default=list(TOKENIZERS), choices=sorted(TOKENIZERS))
    parser.add_argument("--rids", type=int, default=32, help="live rids measured together")
    parser.add_argument("--short", type=int, default=16, help="tokens of a short request")
    parser.add_argument("--long", type=int, default=32768, help="tokens of a long request")
    parser.add_argument("--generic-long", type=int, default=4096, help="tokens for the (slow) generic stream rows")
    parser.add_argument("--quick", action="store_true", help="16 rids, 4096-token long requests, qwen3 only")
    parser.add_argument("--json", default=None, help="result file (default bench/results/memory.json)")
    args = parser.parse_args()
    if args.quick:
        args.rids, args.long, args.generic_long, args.tokenizers = 16, 4096, 1024, ["qwen3"]

    print(machine_line())
    print(
        f"{args.rids} live rids; short = {args.short} tokens, long = {args.long} tokens (generic rows: "
        f"{args.generic_long}); bytes held per rid (tracemalloc)\n"
    )
    rows = []
    for family in available_families(args.tokenizers):
        print(f"measuring {family} ...", file=sys.stderr)
        tokenizer = load_tokenizer(family)
        byte_decoding_for(tokenizer)  # the shared per-tokenizer tables are built at worker start, not per rid
        ids = corpus_ids(tokenizer)
        short = make_streams(ids, args.rids, args.short)
        long = make_streams(ids, args.rids, args.long)
        for stops in ([], FOUR_STOPS):
            for streams in (short, long):
                avoid_stops(streams, tokenizer)
            short_bytes, _ = worker_state_bytes(tokenizer, short, stops)
            long_bytes, shared = worker_state_bytes(tokenizer, long, stops)
            row = _row(f"{family}: WorkerState, {len(stops)} stop strings", short_bytes, long_bytes)
            rows.append({**row, "shared_bytes": shared})
        if family == "qwen3":
            generic_long = make_streams(ids, args.rids, args.generic_long)
            rows.append(
                _row(
                    "qwen3: generic DecodeStream only",
                    generic_stream_bytes(tokenizer, short),
                    generic_stream_bytes(tokenizer, generic_long),
                )
            )
    columns = [
        ("what", "state per live rid", ""),
        ("short_bytes", "short (B)", ",.0f"),
        ("long_bytes", "long (B)", ",.0f"),
        ("growth", "long/short", ".2f"),
        ("shared_bytes", "shared cache growth (B)", ",d"),
    ]
    print_table(rows, columns)
    worst = max(row["growth"] for row in rows)
    verdict = "holds" if worst < 1.25 else "MISSED"  # O(length) state would be hundreds of times larger
    print(f"\ntarget: state per rid flat in request length: worst long/short {worst:.2f} ({verdict})")
    payload = {"rids": args.rids, "short": args.short, "long": args.long, "rows": rows}
    print(f"wrote {write_json('memory', payload, args.json)}")


def _row(what: str, short_bytes: float, long_bytes: float) -> dict[str, Any]:
    return {
        "what": what,
        "short_bytes": short_bytes,
        "long_bytes": long_bytes,
        "growth": long_bytes / short_bytes if short_bytes > 0 else 0.0,
    }


if __name__ == "__main__":
    main()
