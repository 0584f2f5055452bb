"""How many cases each family ran in this session (printed at the end of the run by conftest.py)."""

from __future__ import annotations

from collections import Counter

CASES: Counter[str] = Counter()
