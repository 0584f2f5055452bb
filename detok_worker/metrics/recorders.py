"""Per-role recorders (label children resolved once, so a hot-path call is a few float adds)."""

from __future__ import annotations

import contextlib
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import Counter, Histogram

from detok_worker.metrics.families import ABORT_CAUSES, Metrics, metrics, tokenizer_type
from detok_worker.tokenizer.protocol import Encoding, Tokenizer
from detok_worker.tokenizer.wrapper import TokenizerWrapper


class CounterSync:
    """Turns cumulative per-key counts (a FrameDecoder's bad_frames, a WorkerState's counts) into Prometheus
    counter increments: a key's counter is `family[key]` when `family` maps keys to counters, else the child of
    `family` labelled `*labels, key`."""

    def __init__(self, family: Counter | Mapping[str, Counter], *labels: str) -> None:
        self._family = family
        self._labels = labels
        self._seen: dict[str, int] = {}

    def sync(self, counts: Mapping[str, int]) -> None:
        family = self._family
        for kind, count in counts.items():
            delta = count - self._seen.get(kind, 0)
            if delta > 0:
                (family[kind] if isinstance(family, Mapping) else family.labels(*self._labels, kind)).inc(delta)
                self._seen[kind] = count


class HeldHistogram:
    """One labelled histogram observed in a hot loop, written to Prometheus only at flush(). In multiprocess mode
    prometheus_client writes its mmap file on every observe (the sum and a bucket); here an observation
    is a bisect and two adds, and flush() adds each bucket's count and the sum at once, which is exactly what the
    same observe() calls would have written (the child's buckets and sum are prometheus_client's value objects;
    tests/unit/metrics/test_metrics.py compares the two)."""

    __slots__ = ("_child", "_bounds", "_counts", "_sum")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        self._bounds: list[float] = list(child._upper_bounds)  # ascending, the last is +Inf
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1  # the first bucket with amount <= its bound
        self._sum += amount

    def flush(self) -> None:
        counts = self._counts
        if not any(counts):
            return
        for index, count in enumerate(counts):
            if count:
                self._child._buckets[index].inc(count)
                counts[index] = 0
        self._child._sum.inc(self._sum)
        self._sum = 0.0


class HeldCounter:
    """One counter (a labelled child or an unlabelled family) incremented in plain floats, written at flush()."""

    __slots__ = ("_child", "_amount")

    def __init__(self, child: Counter) -> None:
        self._child = child
        self._amount = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self._amount += amount

    def flush(self) -> None:
        if self._amount:
            self._child.inc(self._amount)
            self._amount = 0.0


class _Held(Protocol):
    def flush(self) -> None: ...


HeldT = TypeVar("HeldT", bound=_Held)


class HeldFamily(Generic[HeldT]):
    """A labelled counter or histogram family whose children are held (HeldCounter, HeldHistogram): labels()
    makes one per label set on first use (creating the Prometheus child, so it is exported from then on)."""

    __slots__ = ("_family", "_held", "_children")

    def __init__(self, family: Any, held: Callable[[Any], HeldT]) -> None:
        self._family = family
        self._held = held
        self._children: dict[tuple[str, ...], HeldT] = {}

    def labels(self, *values: str) -> HeldT:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._held(self._family.labels(*values))
        return child

    def flush(self) -> None:
        for child in self._children.values():
            child.flush()


def _holders(owner: object) -> list[_Held]:
    """The held values among `owner`'s attributes: what its flush() writes."""
    return [value for value in vars(owner).values() if isinstance(value, (HeldCounter, HeldHistogram, HeldFamily))]


class WorkerMetrics:
    """What a worker records: batch() once per TokenBatch (four histogram observations, held in plain ints), and
    sync() once per stats interval, which writes them and copies the worker's own cumulative counts (WorkerState
    keeps them as plain ints)."""

    def __init__(self, worker_id: str, tokenizer: Tokenizer) -> None:
        m = metrics()
        kind = tokenizer_type(tokenizer)
        self._decode = HeldHistogram(m.decode_seconds.labels(kind, "stream_batch"))
        self._batch_rids = HeldHistogram(m.batch_rids.labels(worker_id))
        self._batch_tokens = HeldHistogram(m.batch_tokens.labels(worker_id))
        self._step = HeldHistogram(m.step_seconds.labels(worker_id))
        self._counts = CounterSync(
            {
                "tokens_in": m.tokens_in.labels(worker_id),
                "tokens_consumed": m.stream_tokens.labels(kind, worker_id),
                "chars_out": m.chars_out.labels(worker_id),
                "holds": m.stream_holds.labels(kind, worker_id),
                "unknown_ids": m.unknown_ids.labels(worker_id),
            }
        )
        self._live = m.live_rids.labels("worker", worker_id)
        self._stops = CounterSync(m.stops_detected, kind, worker_id)
        self._bad = CounterSync(m.bad_frames, "worker", worker_id)

    def batch(self, *, rids: int, tokens: int, decode_s: float, step_s: float) -> None:
        self._batch_rids.observe(rids)
        self._batch_tokens.observe(tokens)
        self._decode.observe(decode_s)
        self._step.observe(step_s)

    def sync(
        self,
        *,
        counts: Mapping[str, int],
        stops: Mapping[str, int],
        live_rids: int,
        bad_frames: Mapping[str, int],
    ) -> None:
        """counts: the worker's cumulative counts by metric name (WorkerState.counts); stops: cumulative per kind."""
        for histogram in (self._decode, self._batch_rids, self._batch_tokens, self._step):
            histogram.flush()
        self._counts.sync(counts)
        self._stops.sync(stops)
        self._live.set(live_rids)
        self._bad.sync(bad_frames)


class EngineMetrics:
    def __init__(self) -> None:
        m = metrics()
        self._reopened = CounterSync({"reopened": m.reopened})
        self._live = m.live_rids.labels("engine", "")
        self._bad = CounterSync(m.bad_frames, "engine", "")

    def sync(self, *, live_rids: int, reopened: int, bad_frames: Mapping[str, int]) -> None:
        self._live.set(live_rids)
        self._reopened.sync({"reopened": reopened})
        self._bad.sync(bad_frames)


class FrontMetrics:
    """What the front records: per request, per SSE stream, per TextBatch, per prompt. Every per-request value is
    held in plain numbers (in multiprocess mode each Prometheus write is an mmap write) and written by
    flush(), which the front's sweep and every /metrics scrape call (Dispatcher.flush_counters), so a scrape shows
    exact values."""

    def __init__(self, m: Metrics | None = None) -> None:
        m = m if m is not None else metrics()
        self.draining = m.draining
        self.draining.set(0)
        self._live = m.live_rids.labels("front", "")
        self._bad = CounterSync(m.bad_frames, "front", "")
        self._sse_clients = m.sse_clients  # multiprocess_mode livesum: each front sets its own count
        self._open_sse = 0
        self.front_chars = HeldCounter(m.front_chars)  # per TextBatch: characters and tokens the front took
        self.front_tokens = HeldCounter(m.front_tokens)
        self._requests = HeldFamily(m.requests, HeldCounter)
        self._aborted = HeldFamily(m.aborted, HeldCounter)
        self._responses = HeldFamily(m.http_responses, HeldCounter)
        self._request_seconds = HeldFamily(m.request_seconds, HeldHistogram)
        self._ttft = HeldFamily(m.ttft_seconds, HeldHistogram)
        self._itl = HeldFamily(m.itl_seconds, HeldHistogram)
        self._bus_latency = HeldHistogram(m.bus_latency)
        self._held = _holders(self)
        for cause in ABORT_CAUSES:  # exported as 0 from the start, so rate() and alerts see every cause
            self._aborted.labels(cause)

    def also_flush(self, held: _Held) -> None:
        """Flush another holder (the front's InstrumentedTokenizer) with these."""
        self._held.append(held)

    def request(self, endpoint: str) -> None:
        self._requests.labels(endpoint).inc()

    def aborted(self, cause: str) -> None:
        self._aborted.labels(cause).inc()

    def response(self, endpoint: str, status: int, seconds: float) -> None:
        """One HTTP response: its status by endpoint (a route template) and its duration."""
        self._responses.labels(endpoint, str(status)).inc()
        self._request_seconds.labels(endpoint).observe(seconds)

    def generation(self, endpoint: str, ttft_s: float | None, itl_s: float | None) -> None:
        """One generation request's time to first token and mean inter-token latency (None: not measured)."""
        if ttft_s is not None:
            self._ttft.labels(endpoint).observe(ttft_s)
        if itl_s is not None:
            self._itl.labels(endpoint).observe(itl_s)

    def bus_latency(self, seconds: float) -> None:
        """Engine-to-front latency of one TextBatch."""
        self._bus_latency.observe(seconds)

    def sse_opened(self) -> None:
        self._open_sse += 1

    def sse_closed(self) -> None:
        self._open_sse -= 1

    def flush(self) -> None:
        for held in self._held:
            held.flush()
        self._sse_clients.set(self._open_sse)

    def sync(self, *, live_rids: int, bad_frames: Mapping[str, int]) -> None:
        self._live.set(live_rids)
        self._bad.sync(bad_frames)


class InstrumentedTokenizer(TokenizerWrapper):
    """The front's tokenizer: times the wrapped one's prompt-side calls (encode, encode_batch, apply_chat_template,
    decode) and passes the rest of the protocol through (TokenizerWrapper); optional capabilities are asked of
    `inner`. The timings and sizes are held (HeldHistogram) until flush(): the front registers it with
    FrontMetrics.also_flush. Calls come from the event loop and the front's prompt threads, so the held values are
    updated and flushed under a lock."""

    def __init__(self, tokenizer: Tokenizer, m: Metrics | None = None) -> None:
        super().__init__(tokenizer)
        m = m if m is not None else metrics()
        kind = tokenizer_type(tokenizer)
        self._lock = threading.Lock()
        self._encode = HeldHistogram(m.encode_seconds.labels(kind, "encode"))
        self._encode_batch = HeldHistogram(m.encode_seconds.labels(kind, "encode_batch"))
        self._template = HeldHistogram(m.encode_seconds.labels(kind, "chat_template"))
        self._decode = HeldHistogram(m.decode_seconds.labels(kind, "decode"))
        self._tokens = HeldHistogram(m.tokens_per_encode.labels(kind))
        self._chars = HeldHistogram(m.chars_per_encode.labels(kind))
        self._histograms = _holders(self)

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        with self._timed(self._encode):
            encoding = self.inner.encode(text, add_special_tokens)
        self._sizes(((text, encoding.ids),))
        return encoding

    def encode_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        with self._timed(self._encode):
            ids = self.inner.encode_ids(text, add_special_tokens)
        self._sizes(((text, ids),))
        return ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]:
        with self._timed(self._encode_batch):
            encodings = self.inner.encode_batch(texts, add_special_tokens)
        self._sizes((text, encoding.ids) for text, encoding in zip(texts, encodings, strict=False))
        return encodings

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        with self._timed(self._template):
            return self.inner.apply_chat_template(messages, **kwargs)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        with self._timed(self._decode):
            return self.inner.decode(ids, skip_special_tokens)

    @contextlib.contextmanager
    def _timed(self, histogram: HeldHistogram) -> Iterator[None]:
        """Times the block into `histogram`, a failed call too."""
        started = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - started
            with self._lock:
                histogram.observe(seconds)

    def _sizes(self, encoded: Iterable[tuple[str, list[int]]]) -> None:
        with self._lock:
            for text, ids in encoded:
                self._tokens.observe(len(ids))
                self._chars.observe(len(text))

    def flush(self) -> None:
        with self._lock:
            for histogram in self._histograms:
                histogram.flush()
