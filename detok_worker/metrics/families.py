"""Every metric family of detok (Metrics), built once per process (metrics()), and the label helpers."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from detok_worker.tokenizer.protocol import WrapsTokenizer

RESTART_ENV = "DETOK_RESTART_COUNT"  # set by the supervisor on a restarted worker
ABORT_CAUSES = ("client_disconnected", "client_too_slow", "timeout", "shutdown")

_FAST_SECONDS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_LATENCY_SECONDS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_LOAD_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_SIZES = (16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
_TTFT_SECONDS = (1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_REQUEST_SECONDS = (1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    """Every metric family, built once per process (see metrics())."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry)

        def gauge(name: str, doc: str, labels: Sequence[str], mode: str) -> Gauge:
            return Gauge(name, doc, labels, multiprocess_mode=mode, registry=registry)

        tok_op = ["tokenizer", "operation"]
        tok_worker = ["tokenizer", "worker"]
        self.encode_seconds = histogram(
            "detok_tokenizer_encode_duration_seconds", "Prompt-side tokenizer calls", tok_op, _FAST_SECONDS
        )
        self.decode_seconds = histogram(
            "detok_tokenizer_decode_duration_seconds",
            "Detokenization time: operation=stream_batch is one worker's decoding of one TokenBatch",
            tok_op,
            _FAST_SECONDS,
        )
        self.tokens_per_encode = histogram(
            "detok_tokenizer_tokens_per_encode", "Tokens produced per encode call", ["tokenizer"], _SIZES
        )
        self.chars_per_encode = histogram(
            "detok_tokenizer_chars_per_encode", "Characters of input per encode call", ["tokenizer"], _SIZES
        )
        self.load_seconds = histogram(
            "detok_tokenizer_load_duration_seconds",
            "Tokenizer load time per process (including the streaming fast-path tables in workers)",
            ["tokenizer", "role"],
            _LOAD_SECONDS,
        )
        self.stream_tokens = counter("detok_stream_tokens", "Output tokens consumed by request streams", tok_worker)
        self.stream_holds = counter(
            "detok_stream_holds",
            "Request steps that consumed tokens but released no text yet (an incomplete UTF-8 character, or text "
            "held back as a possible stop-string start)",
            tok_worker,
        )
        self.stops_detected = counter(
            "detok_stop_sequences_detected",
            "Requests ended by a stop rule found in the worker (kind: string or token; EOS counts as a token)",
            [*tok_worker, "kind"],
        )
        self.tokens_in = counter("detok_worker_tokens_in", "Token ids received by a worker", ["worker"])
        self.chars_out = counter("detok_worker_chars_out", "Characters of text sent by a worker", ["worker"])
        self.unknown_ids = counter(
            "detok_worker_unknown_ids",
            "Token ids the tokenizer lacks that the engine's model can emit (below its vocabulary size), decoded as no "
            "text",
            ["worker"],
        )
        self.batch_rids = histogram(
            "detok_worker_batch_rids", "Requests per TokenBatch (opens + token items)", ["worker"], _COUNTS
        )
        self.batch_tokens = histogram("detok_worker_batch_tokens", "Token ids per TokenBatch", ["worker"], _COUNTS)
        self.step_seconds = histogram(
            "detok_worker_step_duration_seconds",
            "Worker time per TokenBatch: decode frame, detokenize, encode and send the TextBatch",
            ["worker"],
            _FAST_SECONDS,
        )
        self.worker_restarts = counter(
            "detok_worker_restarts", "Worker processes restarted by the supervisor", ["worker"]
        )
        self.live_rids = gauge("detok_live_rids", "Live requests held by a process", ["role", "worker"], "livesum")
        self.bad_frames = counter(
            "detok_bad_frames", "Bus frames and items counted as bad and skipped", ["role", "worker", "kind"]
        )
        self.reopened = counter("detok_reopened_rids", "Requests re-opened on another worker after theirs was lost")
        self.requests = counter(
            "detok_requests", "Generation requests accepted by the front (endpoint: the route)", ["endpoint"]
        )
        self.aborted = counter(
            "detok_aborted_requests",
            "Requests the front ended early (cause: client_disconnected, client_too_slow, timeout, shutdown)",
            ["cause"],
        )
        self.sse_clients = gauge("detok_sse_clients", "Open SSE streams", (), "livesum")
        self.front_tokens = counter("detok_front_tokens", "Output tokens of requests that ended at the front")
        self.front_chars = counter("detok_front_chars", "Characters of text the front accepted from workers")
        self.http_responses = counter(
            "detok_http_responses",
            "HTTP responses of the front (endpoint: the route template, or 'unmatched'; status: the HTTP status)",
            ["endpoint", "status"],
        )
        self.request_seconds = histogram(
            "detok_request_duration_seconds",
            "HTTP request arrival -> response end at the front (a stream: its last byte)",
            ["endpoint"],
            _REQUEST_SECONDS,
        )
        self.ttft_seconds = histogram(
            "detok_time_to_first_token_seconds",
            "Generation requests: HTTP request arrival -> the first output delta at the front",
            ["endpoint"],
            _TTFT_SECONDS,
        )
        self.itl_seconds = histogram(
            "detok_inter_token_latency_seconds",
            "Generation requests that finished with output after their first delta: the mean time per output "
            "token from the first delta to the last (one observation per request)",
            ["endpoint"],
            _LATENCY_SECONDS,
        )
        self.draining = gauge("detok_front_draining", "1 while the front drains (SIGTERM), else 0", (), "livemax")
        self.bus_latency = histogram(
            "detok_bus_latency_seconds",
            "Engine-to-front latency of a TextBatch (TokenBatch sent by the engine -> TextBatch at the front)",
            (),
            _LATENCY_SECONDS,
        )

    def family_names(self) -> frozenset[str]:
        """Names of the families defined here (as collected: counters without the _total suffix)."""
        return frozenset(family.name for collector in vars(self).values() for family in collector.describe())


_metrics: Metrics | None = None
_metrics_lock = threading.Lock()


def metrics() -> Metrics:
    """This process's metric families (built on first use, after the supervisor may have set the directory)."""
    global _metrics
    if _metrics is None:
        with _metrics_lock:
            if _metrics is None:
                _metrics = Metrics()
    return _metrics


def tokenizer_type(tokenizer: object) -> str:
    """The backend type label of a tokenizer: HFTokenizer -> hf, TiktokenTokenizer -> tiktoken; wrappers (the
    encode cache) report what they wrap."""
    if isinstance(tokenizer, WrapsTokenizer) and tokenizer.inner is not tokenizer:
        return tokenizer_type(tokenizer.inner)
    name = type(tokenizer).__name__
    for suffix in ("TokenizerAdapter", "Adapter", "Tokenizer"):
        if name.endswith(suffix) and name != suffix:
            name = name[: -len(suffix)]
            break
    return name.lower()


def observe_tokenizer_load(tokenizer: object, seconds: float, role: str) -> None:
    metrics().load_seconds.labels(tokenizer_type(tokenizer), role).observe(seconds)


def record_worker_start(worker_id: str) -> None:
    """Count this worker process as a restart if the supervisor started it as one (one increment per process, so
    the merged counter is the number of restarts of that worker slot)."""
    restarts = metrics().worker_restarts.labels(worker_id)  # exported as 0 until the first restart
    if os.environ.get(RESTART_ENV, "0") not in ("", "0"):
        restarts.inc()
