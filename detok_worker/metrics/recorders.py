"""Per-role recorders (label children resolved once, so a hot-path call is a few float adds)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Histogram

from detok_worker.metrics.families import ABORT_CAUSES, metrics, tokenizer_type
from detok_worker.tokenizer.protocol import Tokenizer


class CounterSync:
    """Turns cumulative per-kind counts (e.g. a FrameDecoder's bad_frames) into Prometheus counter increments."""

    def __init__(self, counter: Counter, *labels: str) -> None:
        self._counter = counter
        self._labels = labels
        self._seen: dict[str, int] = {}

    def sync(self, counts: Mapping[str, int]) -> None:
        for kind, count in counts.items():
            delta = count - self._seen.get(kind, 0)
            if delta > 0:
                self._counter.labels(*self._labels, kind).inc(delta)
                self._seen[kind] = count


class HeldHistogram:
    """One labelled histogram observed in a hot loop, written to Prometheus only at flush(). In multiprocess mode
    prometheus_client writes its mmap file on every observe (~3.5 us: the sum and a bucket); here an observation
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
        self._counters = {
            "tokens_in": m.tokens_in.labels(worker_id),
            "tokens_consumed": m.stream_tokens.labels(kind, worker_id),
            "chars_out": m.chars_out.labels(worker_id),
            "holds": m.stream_holds.labels(kind, worker_id),
        }
        self._seen = dict.fromkeys(self._counters, 0)
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
        """counts: cumulative tokens_in, tokens_consumed, chars_out, holds; stops: cumulative per kind."""
        for histogram in (self._decode, self._batch_rids, self._batch_tokens, self._step):
            histogram.flush()
        for name, counter in self._counters.items():
            delta = counts.get(name, 0) - self._seen[name]
            if delta > 0:
                counter.inc(delta)
                self._seen[name] += delta
        self._stops.sync(stops)
        self._live.set(live_rids)
        self._bad.sync(bad_frames)


class EngineMetrics:
    def __init__(self) -> None:
        m = metrics()
        self._reopened = m.reopened
        self._reopened_seen = 0
        self._live = m.live_rids.labels("engine", "")
        self._bad = CounterSync(m.bad_frames, "engine", "")

    def sync(self, *, live_rids: int, reopened: int, bad_frames: Mapping[str, int]) -> None:
        self._live.set(live_rids)
        if reopened > self._reopened_seen:
            self._reopened.inc(reopened - self._reopened_seen)
            self._reopened_seen = reopened
        self._bad.sync(bad_frames)


class FrontMetrics:
    """What the front records: per request, per SSE stream, per TextBatch, per prompt."""

    def __init__(self) -> None:
        m = metrics()
        self.m = m
        self.draining = m.draining
        self.draining.set(0)
        self._live = m.live_rids.labels("front", "")
        self._bad = CounterSync(m.bad_frames, "front", "")
        self.sse_clients = m.sse_clients
        self.bus_latency = m.bus_latency
        self.front_chars = m.front_chars
        self.front_tokens = m.front_tokens
        for cause in ABORT_CAUSES:  # exported as 0 from the start, so rate() and alerts see every cause
            m.aborted.labels(cause)

    def request(self, endpoint: str) -> None:
        self.m.requests.labels(endpoint).inc()

    def aborted(self, cause: str) -> None:
        self.m.aborted.labels(cause).inc()

    def response(self, endpoint: str, status: int, seconds: float) -> None:
        """One HTTP response: its status by endpoint (a route template) and its duration."""
        self.m.http_responses.labels(endpoint, str(status)).inc()
        self.m.request_seconds.labels(endpoint).observe(seconds)

    def generation(self, endpoint: str, ttft_s: float | None, itl_s: float | None) -> None:
        """One generation request's time to first token and mean inter-token latency (None: not measured)."""
        if ttft_s is not None:
            self.m.ttft_seconds.labels(endpoint).observe(ttft_s)
        if itl_s is not None:
            self.m.itl_seconds.labels(endpoint).observe(itl_s)

    def sync(self, *, live_rids: int, bad_frames: Mapping[str, int]) -> None:
        self._live.set(live_rids)
        self._bad.sync(bad_frames)


class InstrumentedTokenizer:
    """Times a tokenizer's prompt-side calls (encode, encode_batch, apply_chat_template, decode); everything else
    is the wrapped tokenizer's own (attribute access is forwarded)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.inner = tokenizer
        self.name = tokenizer.name
        m = metrics()
        kind = tokenizer_type(tokenizer)
        self._encode = m.encode_seconds.labels(kind, "encode")
        self._encode_batch = m.encode_seconds.labels(kind, "encode_batch")
        self._template = m.encode_seconds.labels(kind, "chat_template")
        self._decode = m.decode_seconds.labels(kind, "decode")
        self._tokens = m.tokens_per_encode.labels(kind)
        self._chars = m.chars_per_encode.labels(kind)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, text: str, add_special_tokens: bool = False) -> Any:
        with self._encode.time():
            encoding = self.inner.encode(text, add_special_tokens)
        self._tokens.observe(len(encoding.ids))
        self._chars.observe(len(text))
        return encoding

    def encode_batch(self, texts: Any, add_special_tokens: bool = False) -> Any:
        with self._encode_batch.time():
            encodings = self.inner.encode_batch(texts, add_special_tokens)
        for text, encoding in zip(texts, encodings, strict=False):
            self._tokens.observe(len(encoding.ids))
            self._chars.observe(len(text))
        return encodings

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> str:
        with self._template.time():
            return self.inner.apply_chat_template(messages, **kwargs)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        with self._decode.time():
            return self.inner.decode(ids, skip_special_tokens)
