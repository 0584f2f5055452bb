"""Micro-benchmark: StopSequenceDecoder tokens/s with 0, 4 and 50 stop strings on interleaved Qwen3 streams.

Every engine step gives each of N streams its next k ids (one process_tokens call per stream per step, as the
worker does). The stop strings never match the text, so every stream runs to its end and all configurations
process the same ids; with 50 strings many of them share prefixes with the text, so text is held back and
released all the time (a hard case, not the easy one). The plain DecodeStream (no stop decoder)
is measured as the reference. Numbers go to BENCHMARKS.md, never into tests.

    python bench/bench_stop.py [--streams 256] [--tokens 400] [--tokens-per-step 1 8] [--repeat 5]

Times are CPU time of this process (time.process_time), so other load on the machine skews them less.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from common import CORPUS_DIRS, QWEN3_DIR

from detok_worker.stream import DecodeStream, StopSequenceConfig, StopSequenceDecoder
from detok_worker.tokenizer import create_tokenizer

FOUR_STOPS = ("\n\nUser:", "</answer>", "###", "Observation:")
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will more"
)
COMMON_WORDS = _WORDS.split()
FIFTY_STOPS = tuple(f"{COMMON_WORDS[index % len(COMMON_WORDS)]} zq{index}" for index in range(50))


def load_streams(tokenizer, n_streams: int, n_tokens: int) -> list[list[int]]:
    """n_streams id sequences of real text (the corpus, each stream starting at a different place)."""
    text = "\n\n".join(path.read_text(encoding="utf-8") for path in sorted(CORPUS_DIRS[-1].glob("*.txt")))
    ids = tokenizer.encode(text).ids
    while len(ids) < 2 * n_tokens:
        ids = ids + ids
    step = max(1, (len(ids) - n_tokens) // n_streams)
    return [ids[(k * step) % (len(ids) - n_tokens) :][:n_tokens] for k in range(n_streams)]


def run_once(make: Callable[[], object], streams: list[list[int]], per_step: int, method: str) -> tuple[float, int]:
    """CPU seconds (robust on a busy machine) and ids processed for one pass over all streams, interleaved."""
    states = [make() for _ in streams]
    calls = [getattr(state, method) for state in states]
    length = len(streams[0])
    processed = 0
    start = time.process_time()
    for position in range(0, length, per_step):
        for call, ids in zip(calls, streams, strict=True):
            call(ids[position : position + per_step])
        processed += len(streams) * len(range(position, min(position + per_step, length)))
    return time.process_time() - start, processed


def best_rate(make: Callable[[], object], streams: list[list[int]], per_step: int, method: str, repeat: int) -> float:
    best = 0.0
    for _ in range(repeat):
        seconds, processed = run_once(make, streams, per_step, method)
        best = max(best, processed / seconds)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=400, help="ids per stream")
    parser.add_argument("--tokens-per-step", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=5, help="runs per configuration; the best is reported")
    args = parser.parse_args()

    tokenizer = create_tokenizer(str(QWEN3_DIR))
    streams = load_streams(tokenizer, args.streams, args.tokens)
    text = tokenizer.decode([i for ids in streams for i in ids])
    assert not any(stop in text for stop in (*FOUR_STOPS, *FIFTY_STOPS)), "a benchmark stop string matches the text"
    eos = sorted(tokenizer.eos_token_ids)
    configs = {
        "0 stop strings (EOS stop token only)": StopSequenceConfig(stop_tokens=eos),
        "4 stop strings + EOS": StopSequenceConfig(stop_tokens=eos, stop_sequences=FOUR_STOPS),
        "50 stop strings + EOS": StopSequenceConfig(stop_tokens=eos, stop_sequences=FIFTY_STOPS),
    }
    print(f"Qwen3, {args.streams} interleaved streams x {args.tokens} ids of corpus text, best of {args.repeat}")
    for per_step in args.tokens_per_step:
        print(f"\n{per_step} id(s) per stream per step:")
        baseline = best_rate(lambda: DecodeStream(tokenizer), streams, per_step, "step_batch", args.repeat)
        print(f"  {'DecodeStream.step_batch (no stop decoder)':44s} {baseline / 1e6:6.2f} M tokens/s")
        no_stop = 0.0
        for name, config in configs.items():

            def make(config: StopSequenceConfig = config) -> StopSequenceDecoder:
                return StopSequenceDecoder(tokenizer, config)

            rate = best_rate(make, streams, per_step, "process_tokens", args.repeat)
            no_stop = no_stop or rate
            print(
                f"  {name:44s} {rate / 1e6:6.2f} M tokens/s  {100 * rate / baseline:5.1f}% of DecodeStream"
                f"  {100 * rate / no_stop:5.1f}% of 0 stops"
            )


if __name__ == "__main__":
    main()
