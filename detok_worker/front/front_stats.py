"""/stats across front processes: with front.processes > 1 a client's GET /stats reaches any one of them, so each
front writes its own section to the service's shared directory at every sweep (a small JSON file, replaced
atomically) and /stats reads the others' from there: `fronts` lists every front's section, `front_totals` sums
their counts. A front that died stops refreshing its file; past FRONT_STALE_S it is left out (a restarted front
with the same index replaces it). The directory is the one the supervisor gives every child for metrics
(PROMETHEUS_MULTIPROC_DIR); a front started on its own has none and reports only itself.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.loading.load_cache import write_atomically

SNAPSHOT_PREFIX = "front-stats-"
FRONT_STALE_S = 5.0  # sweeps refresh a front's file every second (dispatch.SWEEP_INTERVAL_S)


def snapshot_path(directory: str | os.PathLike[str], index: int) -> Path:
    return Path(directory) / f"{SNAPSHOT_PREFIX}{index}.json"


def write_snapshot(directory: str | os.PathLike[str], index: int, section: dict[str, Any]) -> None:
    write_atomically(snapshot_path(directory, index), json.dumps(section))


def all_fronts(
    directory: str | os.PathLike[str] | None, own: dict[str, Any], now: float | None = None
) -> list[dict[str, Any]]:
    """Every live front's section, by index: `own` (fresh) and the others' last snapshots with their age_s."""
    fronts = {own["index"]: own}
    if directory is not None:
        now = time.time() if now is None else now
        for path in Path(directory).glob(f"{SNAPSHOT_PREFIX}*.json"):
            try:
                age = now - path.stat().st_mtime
                section = json.loads(path.read_text())
            except (OSError, ValueError):  # replaced or removed while read: the next /stats sees it
                continue
            index = section.get("index")
            if age <= FRONT_STALE_S and isinstance(index, int) and index not in fronts:
                fronts[index] = {**section, "age_s": round(age, 3)}
    return [fronts[index] for index in sorted(fronts)]


def front_totals(fronts: list[dict[str, Any]]) -> dict[str, Any]:
    """The fronts' counts summed: every integer field, and the per-kind bad_frames counts."""
    totals: Counter[str] = Counter()
    bad_frames: Counter[str] = Counter()
    for section in fronts:
        for key, value in section.items():
            if type(value) is int and key not in ("index", "pid"):
                totals[key] += value
        bad_frames.update(section.get("bad_frames") or {})
    return {"processes": len(fronts), **totals, "bad_frames": dict(bad_frames)}
