"""`Admission`: the stub engines' capped batch (`PlannedEngine`, `GeneratorEngine`): requests wait in arrival
order and at most `cap` of them run at once, as an engine's continuous batching admits them."""

from __future__ import annotations

from typing import Generic, TypeVar

T = TypeVar("T")


class Admission(Generic[T]):
    """Requests by rid: `running` (at most `cap`; None: no cap) and `waiting` (arrival order)."""

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.running: dict[str, T] = {}
        self.waiting: dict[str, T] = {}  # insertion order is arrival order

    def __contains__(self, rid: str) -> bool:
        return rid in self.running or rid in self.waiting

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, rid: str, request: T) -> None:
        """Queue a request behind the waiting ones; the caller keeps rids unique (`rid in admission`)."""
        self.waiting[rid] = request

    def remove(self, rid: str) -> T | None:
        """Drop a request, running or waiting; the removed one, or None if `rid` is not here."""
        if rid in self.running:
            return self.running.pop(rid)
        return self.waiting.pop(rid, None)

    def admit(self) -> dict[str, T]:
        """Move waiting requests to running while there is room; the running ones."""
        running, waiting, cap = self.running, self.waiting, self.cap
        while waiting and (cap is None or len(running) < cap):
            rid = next(iter(waiting))
            running[rid] = waiting.pop(rid)
        return running
