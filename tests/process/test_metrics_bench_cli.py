"""`detok bench`: every scenario names a script that exists, and a real run of the quick memory scenario through the
CLI writes its JSON, with worker state per live rid flat in request length (invariant 4; bytes, not time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers.fixtures import REPO

from detok_worker.cli.bench import BENCH_DIR, SCENARIOS


def test_every_scenario_has_its_script() -> None:
    for scenario, (script, _) in SCENARIOS.items():
        assert (BENCH_DIR / script).is_file(), scenario


def test_every_bench_script_imports() -> None:
    """Each script in bench/ imports in a fresh interpreter (as `python bench/X.py` runs it: bench/ on the path):
    a name a script imports from a helper module that no longer has it fails here, not in a user's bench run."""
    scripts = sorted(path.stem for path in BENCH_DIR.glob("*.py"))
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run(
        [sys.executable, "-c", code, *scripts], cwd=BENCH_DIR, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bench_gateway" in scripts and "bench_worker" in scripts


def test_bench_memory_quick_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "memory.json"
    result = subprocess.run(
        [sys.executable, "-m", "detok_worker.cli", "bench", "memory", "--quick", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "state per live rid" in result.stdout
    report = json.loads(out.read_text())
    assert report["benchmark"] == "memory" and report["machine"]["cores"] >= 1
    rows = report["rows"]
    assert rows
    for row in rows:
        # a rid holds ~1 KB whatever its length; state that grew with the 4096-token requests would be far larger
        assert 0 < row["short_bytes"] < 10_000, row
        assert row["long_bytes"] < 1.5 * row["short_bytes"], row
