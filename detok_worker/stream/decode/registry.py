"""Per-tokenizer derived data (byte tables, probe ids), built once and shared by every stream of that tokenizer.

Keyed by the tokenizer object itself (weakly where possible), never stored on it: tokenizer objects are shared and
stay free of stream state. Building is serialised per process so two threads never build the same entry twice.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.RLock()
_weak: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_strong: dict[int, tuple[Any, dict[str, Any]]] = {}  # for tokenizer objects that cannot be weakly referenced


def _entries(tokenizer: Any) -> dict[str, Any]:
    try:
        return _weak.setdefault(tokenizer, {})
    except TypeError:
        return _strong.setdefault(id(tokenizer), (tokenizer, {}))[1]


def cached(tokenizer: Any, key: str, build: Callable[[], T]) -> T:
    """The value stored for (tokenizer, key), building it with build() the first time."""
    try:
        return _weak[tokenizer][key]
    except (KeyError, TypeError):
        pass
    with _lock:
        entries = _entries(tokenizer)
        if key not in entries:
            entries[key] = build()
        return entries[key]
