"""Prints how many differential cases each family ran (every one of them was checked per step; a mismatch fails
its test)."""

from __future__ import annotations

import pytest

from differential.tally import CASES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if CASES:
        counts = ", ".join(f"{name} {count}" for name, count in sorted(CASES.items()))
        terminalreporter.write_line(f"differential cases: {counts}; total {sum(CASES.values())}")
