"""Rids that ended on this worker recently: their late tokens are dropped quietly, not counted as bad."""

from __future__ import annotations


class RecentlyEnded:
    """Bounded insertion-ordered set of rids that ended here, so their late tokens are dropped quietly."""

    def __init__(self, capacity: int) -> None:
        self._rids: dict[str, None] = {}
        self._capacity = capacity

    def add(self, rid: str) -> None:
        self._rids.pop(rid, None)
        self._rids[rid] = None
        if len(self._rids) > self._capacity:
            del self._rids[next(iter(self._rids))]

    def discard(self, rid: str) -> None:
        self._rids.pop(rid, None)

    def __contains__(self, rid: str) -> bool:
        return rid in self._rids
