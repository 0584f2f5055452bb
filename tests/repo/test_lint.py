"""The code base stays ruff-clean (lint and format), as the developers' guide requires; CI runs this."""

from __future__ import annotations

import shutil
import subprocess
import sys

from helpers.fixtures import REPO


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    command = [shutil.which("ruff") or "", *args] if shutil.which("ruff") else [sys.executable, "-m", "ruff", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_ruff_check_is_clean() -> None:
    result = _ruff("check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr
