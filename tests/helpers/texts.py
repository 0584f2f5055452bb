"""The test texts in tests/fixtures/texts/ (see LICENSES.md there)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

TEXTS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "texts"


@lru_cache(maxsize=1)
def load_texts() -> dict[str, str]:
    """name (file stem) -> text, for every .txt file."""
    return {path.stem: path.read_text(encoding="utf-8") for path in sorted(TEXTS_DIR.glob("*.txt"))}


def text_lines() -> list[tuple[str, str]]:
    """(label, line) for every non-empty line of every text, line ends kept."""
    return [
        (f"{name}:{number}", line)
        for name, text in load_texts().items()
        for number, line in enumerate(text.splitlines(keepends=True), 1)
        if line.strip()
    ]
