"""Start-up: `detok serve --workers N` (Qwen3, corpus source) from process start to /health 200 with every worker
registered, and where a process's time goes before it serves.

- serve: median of --repeat starts with a warm disk cache (the fast-path tables written by an unmeasured first
  start into a fresh cache directory) and, with --cold, of starts each against a fresh empty cache directory.
- phases: CPU seconds of each role's start-up steps in a fresh process (median of --repeat; CPU, not wall time,
  so that other jobs on the machine inflate them less): interpreter start, importing
  the `detok` CLI, importing the role's module, creating the tokenizer (the front builds the library tokenizer
  here; the others defer it), and the role's own preparation (the worker's fast-path tables, the front's app
  with its encode cache, the engine's token source). A process pays these in parallel with the
  others, on however many cores there are: the sum over the processes, divided by the cores, is the floor of the
  time to healthy.

/proc/loadavg is printed before and after: on a shared machine the absolute numbers scale with it.

    python bench/bench_startup.py [--repeat 3] [--workers 2] [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench_load import load_average, serve_time_to_healthy
from common import REPO, machine_line, write_json

# Run in a child: time each start-up step of one role (the cache directory comes from the env).
_PHASES = """
import json, sys, time
role = sys.argv[1]
marks = [("interpreter", time.process_time())]
import detok_worker.cli.main
marks.append(("import cli", time.process_time()))
if role == "worker":
    import detok_worker.worker.process
elif role == "front":
    import detok_worker.front.server
else:
    import detok_worker.engine.sources.factory
    import engine_stub.local
marks.append(("import role", time.process_time()))
from detok_worker.config import DetokConfig
from detok_worker.tokenizer import load_configured_tokenizer
config = DetokConfig()
tokenizer = load_configured_tokenizer(config, eager=role == "front")
marks.append(("tokenizer", time.process_time()))
if role == "worker":
    from detok_worker.stream import byte_decoding_for
    byte_decoding_for(tokenizer)
elif role == "front":
    from detok_worker.front.app import create_app
    create_app(config, tokenizer)
else:
    from engine_stub.local import create_local_source
    create_local_source(config, tokenizer)
marks.append(("prepare", time.process_time()))
print(json.dumps({"marks": marks}))
"""
ROLES = ("front", "worker", "engine")


def interpreter_start_s() -> float:
    """Wall seconds of `python -c pass` (the floor of every process)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def role_phases(role: str, cache: str) -> dict[str, float]:
    """CPU seconds per start-up step of `role` in a fresh process, its CPU total and its wall time."""
    env = dict(os.environ, DETOK_CACHE_DIR=cache, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PHASES, role], env=env, capture_output=True, text=True, check=True)
    total = time.perf_counter() - start
    data = json.loads(out.stdout.strip().splitlines()[-1])
    marks = data["marks"]
    phases = {name: later - earlier for (_, earlier), (name, later) in zip(marks, marks[1:], strict=False)}
    return {"interpreter": marks[0][1], **phases, "cpu": marks[-1][1], "wall": total}


def serve_start(workers: int, cache: str) -> tuple[float, float]:
    """Seconds to healthy, and CPU seconds of every process of that run from start to stop (the stop included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = serve_time_to_healthy(workers, cache)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the supervisor was waited for: its children count too
    return seconds, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="samples per measurement (median)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="also time starts against an empty cache directory")
    parser.add_argument("--json", help="result file (default bench/results/startup.json)")
    args = parser.parse_args()
    print(machine_line())
    load_before = load_average()
    print(f"load average before: {load_before}")
    result: dict[str, Any] = {"workers": args.workers, "load_before": load_before}
    with tempfile.TemporaryDirectory(prefix="detok-bench-startup-") as base:
        warm = tempfile.mkdtemp(dir=base)
        serve_time_to_healthy(args.workers, warm)  # fills the cache
        python = [interpreter_start_s() for _ in range(args.repeat)]
        print(f"\npython -c pass: median {statistics.median(python):.3f} s")
        print("\nper role, fresh process, warm cache (median CPU s; wall = the whole process, wall clock):")
        result["phases"] = {}
        for role in ROLES:
            samples = [role_phases(role, warm) for _ in range(args.repeat)]
            medians = {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}
            result["phases"][role] = medians
            print(f"  {role:7s}" + "  ".join(f"{key} {value:.3f}" for key, value in medians.items()))
        runs = {"warm": [serve_start(args.workers, warm) for _ in range(args.repeat)]}
        if args.cold:
            runs["cold"] = [serve_start(args.workers, tempfile.mkdtemp(dir=base)) for _ in range(args.repeat)]
    print(f"\ndetok serve --workers {args.workers} (Qwen3) to /health 200 with every worker registered:")
    for state, samples in runs.items():
        seconds, cpu = [sample[0] for sample in samples], [sample[1] for sample in samples]
        print(
            f"  {state} cache: median {statistics.median(seconds):.2f} s of {[round(v, 2) for v in seconds]}; "
            f"CPU of all processes, start to stop: median {statistics.median(cpu):.2f} s"
        )
    result["serve"] = {state: {"seconds": [a for a, _ in v], "cpu_s": [b for _, b in v]} for state, v in runs.items()}
    result["load_after"] = load_average()
    print(f"load average after: {result['load_after']}")
    print(f"results: {write_json('startup', result, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
