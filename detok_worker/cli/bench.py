"""`detok bench SCENARIO [ARGS...]`: run one of the benchmark scripts in bench/ (a source checkout) with this
Python. ARGS go to the script unchanged (`detok bench core --quick`, `detok bench bus --workers 1 2 4`); each
script prints its tables, writes bench/results/<scenario>.json and says which targets hold. Numbers go to
BENCHMARKS.md, never into tests."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from detok_worker.config.flags import add_command
from detok_worker.errors import OperatorError

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench_scripts"  # bench/, shipped as package data
SCENARIOS = {
    "core": ("bench_core.py", "streaming core: fast/generic path vs tokenizers, SGLang-style, naive; stop strings"),
    "stop": ("bench_stop.py", "stop decoder with 0, 4 and 50 stop strings"),
    "encode-cache": ("bench_encode_cache.py", "prompt encode cache scenarios"),
    "worker": ("bench_worker.py", "the worker's whole per-batch path (decode, stops, framing) vs DecodeStream"),
    "bus": ("bench_bus.py", "engine -> ZMQ -> workers -> collector, vs null workers (transport limit)"),
    "http": ("bench_http.py", "concurrent SSE clients against detok serve"),
    "vllm": ("bench_vllm.py", "one real vLLM engine behind vLLM's server, SMG, detok --source grpc and --source vllm"),
    "memory": ("bench_memory.py", "worker state bytes per live rid, short vs 32k-token requests"),
    "scaling": ("bench_scaling.py", "throughput with 1, 2, 4 workers"),
    "load": ("bench_load.py", "tokenizer create + fast-path tables (cold/warm disk cache), detok serve to healthy"),
    "startup": ("bench_startup.py", "detok serve to healthy, and each role's start-up steps in a fresh process"),
    "chart": ("bench_chart.py", "PNG chart from the JSON results (needs the bench extra: matplotlib)"),
}


def cmd_bench(args: argparse.Namespace, config: object) -> int:
    path = BENCH_DIR / SCENARIOS[args.scenario][0]
    if not path.is_file():
        raise OperatorError(f"{path} not found: `detok bench` runs from a source checkout of detok")
    return subprocess.call([sys.executable, str(path), *args.script_args])


def add_bench_command(commands: argparse._SubParsersAction) -> None:
    """Register `detok bench` on the `detok` sub-command parser."""
    listing = "\n".join(f"  {name:<13} {help_text}" for name, (_, help_text) in SCENARIOS.items())
    bench = add_command(
        commands,
        "bench",
        cmd_bench,
        "run a benchmark scenario (bench/ scripts)",
        description=f"{__doc__}\n\nscenarios:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("scenario", choices=sorted(SCENARIOS), metavar="SCENARIO", help="one of the scenarios below")
    bench.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the script")
