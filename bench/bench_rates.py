"""The production-rate table and charts: bench_vllm.py runs on engine_stub's model-free vLLM worker (vLLM's own
engine core and scheduler, seeded ids, a fixed step time), one run per offered rate, read from their result files
and put side by side: delivered tokens/s against what the engine offered, the front side's CPU per 1000 tokens,
TTFT and inter-token gap, exactness and lost workers, one line per system (vLLM's server with 1 and 2 API servers,
detok with 1 and 2 fronts: `--api-server-count`, which detok honours as front.processes).

    python bench/bench_rates.py [--results bench/results/production] [--out bench/charts/production.png]

Each result file is one `bench_vllm.py --model-free-step-ms MS --json FILE` run (see BENCHMARKS.md for the grid).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common import REPO, RESULTS_DIR, print_table

DEFAULT_RESULTS = RESULTS_DIR / "production"
DEFAULT_OUT = REPO / "bench" / "charts" / "production.png"
UNPACED = "unpaced"


def fronts(payload: dict[str, Any]) -> int:
    """How many API servers / front processes the run asked for (vLLM's --api-server-count, 1 by default)."""
    for flag in payload.get("engine_flags", []):
        if flag.startswith("--api-server-count="):
            return int(flag.split("=", 1)[1])
    return 1


def rows(results: Path) -> list[dict[str, Any]]:
    """One row per (run file, system, clients): the bench's medians, named by system and front count."""
    found = []
    for path in sorted(results.glob("*.json")):
        payload = json.loads(path.read_text())
        step = payload.get("model_free_step_ms")
        if step is None:
            continue
        exact = {(e["system"], e["clients"]): e for e in payload.get("exactness", [])}
        for row in payload["medians"]:
            count = fronts(payload)
            name = "vLLM serve" if row["system"] == "vllm" else "detok serve"
            unit = "API server" if row["system"] == "vllm" else "front"
            checks = exact.get((row["system"], row["clients"]), {})
            found.append({
                **row,
                "line": f"{name}, {count} {unit}{'s' if count > 1 else ''}",
                "offered": row.get("offered_tokens_per_s") or UNPACED,
                "step_ms": step,
                "exact": f"{checks.get('decode_equal', 0)}/{checks.get('checked', 0)}",
            })  # fmt: skip
    return sorted(found, key=order)


def order(row: dict[str, Any]) -> tuple[int, float, str]:
    """By clients, then offered rate (unpaced last), then system."""
    offered = float("inf") if row["offered"] == UNPACED else row["offered"]
    return row["clients"], offered, row["line"]


COLUMNS = [
    ("clients", "clients", "d"),
    ("offered", "offered tok/s", ""),
    ("line", "system", "s"),
    ("tokens_per_s", "delivered tok/s", ",.0f"),
    ("delivered_share", "share", ".2f"),
    ("cpu_front_side", "front side s/1k", ".3f"),
    ("ttft_p50_ms", "TTFT p50", ".0f"),
    ("ttft_p99_ms", "TTFT p99", ".0f"),
    ("gap_p50_ms", "gap p50", ".1f"),
    ("gap_p99_ms", "gap p99", ".1f"),
    ("cpu_client", "client s/1k", ".3f"),
    ("exact", "exact vs decode", "s"),
    ("failed", "failed", "d"),
    ("lost_workers", "lost workers", "d"),
]


def table(found: list[dict[str, Any]]) -> None:
    cells = [{**row, "offered": f"{row['offered']:,.0f}" if row["offered"] != UNPACED else UNPACED} for row in found]
    print_table(cells, COLUMNS)


def chart(found: list[dict[str, Any]], out: Path) -> None:
    """Per client count: delivered tokens/s and p99 inter-token gap against the offered rate, a line per system
    (the unpaced runs sit at the right, at the rate vLLM's scheduler gave unpaced)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = sorted({row["clients"] for row in found})
    figure, axes = plt.subplots(2, len(levels), figsize=(6.5 * len(levels), 9), squeeze=False)
    for column, clients in enumerate(levels):
        paced = [row for row in found if row["clients"] == clients and row["offered"] != UNPACED]
        for line in sorted({row["line"] for row in paced}):
            points = sorted((row["offered"], row) for row in paced if row["line"] == line)
            offered = [p[0] / 1e3 for p in points]
            axes[0][column].plot(offered, [p[1]["tokens_per_s"] / 1e3 for p in points], marker="o", label=line)
            axes[1][column].plot(offered, [p[1]["gap_p99_ms"] for p in points], marker="o", label=line)
        top = max((row["offered"] for row in paced), default=0) / 1e3
        axes[0][column].plot([0, top], [0, top], linestyle=":", color="grey", label="offered")
        axes[0][column].set_title(f"{clients} streaming clients: delivered tokens/s")
        axes[0][column].set_ylabel("k tokens/s delivered")
        axes[1][column].set_title(f"{clients} streaming clients: p99 inter-token gap")
        axes[1][column].set_ylabel("ms")
        for axis in (axes[0][column], axes[1][column]):
            axis.set_xlabel("k tokens/s offered by the engine")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=7)
    figure.suptitle("vLLM's engine core on the model-free worker: vllm serve vs detok serve --source vllm")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(DEFAULT_RESULTS))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--no-chart", action="store_true")
    args = parser.parse_args()
    found = rows(Path(args.results))
    if not found:
        raise SystemExit(f"no bench_vllm --model-free-step-ms results in {args.results}")
    table(found)
    if not args.no_chart:
        chart(found, Path(args.out))


if __name__ == "__main__":
    main()
