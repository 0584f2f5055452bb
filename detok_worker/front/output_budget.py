"""How much text the front holds for clients that have not taken it yet, and which client is too slow.

A stream's untaken text is bounded by front.max_pending_chars (a client that stopped reading is failed with
client_too_slow and aborted in the engine). Over all streams it is bounded by front.max_total_pending_chars,
counting finished requests whose handler has not taken their text yet (`unread`) until the handler releases them.
Past it, a live stream holding more than the budget over the live streams is failed as its text arrives; a new
request is refused and the finished ones holding more than the budget over all streams holding text are failed
the same way, so the requests after it are served. The running total is added to as text is buffered and
recounted exactly when it matters (a refusal, each sweep).
"""

from __future__ import annotations

from collections import Counter

from detok_worker.config import FrontConfig
from detok_worker.front.errors import SERVICE_UNAVAILABLE, APIError
from detok_worker.front.request_stream import RequestStream
from detok_worker.metrics import FrontMetrics


class OutputBudget:
    """The untaken text over `live` (the dispatcher's rid -> stream table) and the finished-but-unread streams."""

    def __init__(
        self, front: FrontConfig, live: dict[str, RequestStream], counters: Counter[str], metrics: FrontMetrics
    ) -> None:
        self.limit = front.max_pending_chars
        self.budget = front.max_total_pending_chars
        self.total = 0  # added to as text is buffered, recounted exactly by `recount`
        self.unread: dict[str, RequestStream] = {}  # finished, with text its handler has not taken yet
        self._live = live
        self._counters = counters
        self._metrics = metrics

    def too_slow(self, stream: RequestStream) -> APIError | None:
        """The error that ends a live stream over its limit or over its share of an exceeded budget, else None."""
        pending = stream.pending_chars
        if pending > self.limit or (self.total > self.budget and pending > self.budget // len(self._live)):
            return self.too_slow_error(stream)
        return None

    def too_slow_error(self, stream: RequestStream) -> APIError:
        self._counters["client_too_slow"] += 1
        message = f"the client did not read the stream fast enough ({stream.pending_chars} characters buffered)"
        return APIError(503, message, type=SERVICE_UNAVAILABLE, code="client_too_slow")

    def over(self) -> bool:
        """Whether a new request must be refused: the budget is exceeded, counted exactly. Then the finished
        requests holding more than their fair share lose their text, so clients that stopped reading cannot keep
        the front refusing requests (their stream ends with client_too_slow)."""
        if self.total <= self.budget or self.recount() <= self.budget:
            return False
        share = self.budget // (len(self._live) + len(self.unread))
        for rid, stream in list(self.unread.items()):
            if stream.pending_chars > share:
                del self.unread[rid]
                self._metrics.aborted("client_too_slow")
                stream.fail(self.too_slow_error(stream), drop_text=True)
        self.recount()
        return True

    def recount(self) -> int:
        for rid in [rid for rid, stream in self.unread.items() if not stream.pending_chars]:
            del self.unread[rid]
        streams = (*self._live.values(), *self.unread.values())
        self.total = sum(stream.pending_chars for stream in streams)
        return self.total
