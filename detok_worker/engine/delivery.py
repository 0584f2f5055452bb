"""Requests whose generation ended but whose final text the front has not confirmed yet (`Delivered`).

The last ids of a request (or the ids in which its worker found a stop) may still sit in that worker's queues
when it dies; the engine then re-opens the request with its whole history. So an ended request is kept here,
under the worker that ended it, until the front confirms, or for `grace_s` at most: a front that never sends
Delivered (an older one, a collector that only listens) costs memory for that long, nothing more.
"""

from __future__ import annotations

from typing import Generic, TypeVar

R = TypeVar("R")


class Undelivered(Generic[R]):
    """rid -> (request, worker, ended at), oldest first; plus the rids of each worker."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._entries: dict[str, tuple[R, str, float]] = {}
        self._by_worker: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: str) -> bool:
        return rid in self._entries

    def rids(self, worker: str | None = None) -> set[str]:
        return set(self._entries) if worker is None else set(self._by_worker.get(worker, ()))

    def hold(self, rid: str, request: R, worker: str, now: float) -> None:
        self.forget(rid)
        self._entries[rid] = (request, worker, now)
        self._by_worker.setdefault(worker, set()).add(rid)

    def forget(self, rid: str) -> bool:
        entry = self._entries.pop(rid, None)
        if entry is None:
            return False
        worker = entry[1]
        rids = self._by_worker[worker]
        rids.discard(rid)
        if not rids:
            del self._by_worker[worker]
        return True

    def take_worker(self, worker: str) -> list[R]:
        """The worker is lost: its ended requests, no longer held here (the caller re-opens them)."""
        return [self._entries.pop(rid)[0] for rid in self._by_worker.pop(worker, ())]

    def expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            rid, (_, _, ended_at) = next(iter(entries.items()))
            if now - ended_at <= self.grace_s:
                return
            self.forget(rid)
