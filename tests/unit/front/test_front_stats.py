"""/stats across front processes (front/front_stats.py): each front's section through the shared directory."""

from __future__ import annotations

import os
import time
from pathlib import Path

from detok_worker.front.front_stats import FRONT_STALE_S, all_fronts, front_totals, snapshot_path, write_snapshot


def section(index: int, completed: int, schema: int = 0) -> dict:
    return {
        "index": index,
        "pid": 100 + index,
        "live_rids": index,
        "completed": completed,
        "bad_frames": {"schema": schema},
    }


def test_every_live_front_is_listed_once_and_its_counts_summed(tmp_path: Path) -> None:
    write_snapshot(tmp_path, 0, section(0, 5))  # this front's own, stale by now: the fresh one wins
    write_snapshot(tmp_path, 1, section(1, 7, schema=2))
    write_snapshot(tmp_path, 2, section(2, 11, schema=1))
    old = time.time() - FRONT_STALE_S - 1
    os.utime(snapshot_path(tmp_path, 2), (old, old))  # front 2 died: its file is no longer refreshed
    (tmp_path / "front-stats-9.json").write_text("{not json")  # half-written or foreign: skipped
    own = section(0, 6)
    fronts = all_fronts(tmp_path, own)
    assert [front["index"] for front in fronts] == [0, 1]
    assert fronts[0] is own and fronts[1]["completed"] == 7 and fronts[1]["age_s"] >= 0
    totals = front_totals(fronts)
    assert totals == {"processes": 2, "live_rids": 1, "completed": 13, "bad_frames": {"schema": 2}}
    assert not list(tmp_path.glob("*.tmp"))  # written by rename: no temporary left behind


def test_a_front_without_a_shared_directory_reports_itself() -> None:
    own = section(0, 3)
    assert all_fronts(None, own) == [own]
    assert front_totals([own])["completed"] == 3
