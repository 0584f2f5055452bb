"""The stub's planned requests waiting to run: at most engine.max_batch of them generate at once, the rest wait
here in arrival order (a pushed request, whose engine schedules it, runs from its submit on and never waits)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from detok_worker.engine.plans import Request


class Admission:
    """Waiting requests in arrival order, found by rid."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._queue: deque[Request] = deque()
        self._by_rid: dict[str, Request] = {}

    def __len__(self) -> int:
        return len(self._by_rid)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)

    def get(self, rid: str) -> Request | None:
        return self._by_rid.get(rid)

    def add(self, request: Request) -> None:
        self._queue.append(request)
        self._by_rid[request.rid] = request

    def remove(self, rid: str) -> bool:
        """Forget a waiting request; False when `rid` is not waiting."""
        if self._by_rid.pop(rid, None) is None:
            return False
        self._queue = deque(request for request in self._queue if request.rid != rid)
        return True

    def admit(self, running: int) -> Iterator[Request]:
        """The requests that may run now that `running` do, oldest first (each leaves the queue as it is taken)."""
        while self._queue and running < self.max_batch:
            request = self._queue.popleft()
            del self._by_rid[request.rid]
            running += 1
            yield request
