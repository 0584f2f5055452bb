"""Prometheus metrics of every detok process, exposed by the front at GET /metrics.

Multiprocess mode: `detok serve` makes `<runtime dir>/metrics` (empty at start, removed with the runtime dir)
and gives every child PROMETHEUS_MULTIPROC_DIR pointing at it, so each process writes its values to its own mmap
files and the front's /metrics merges them (prometheus_client's MultiProcessCollector); the supervisor drops a
dead child's live gauges. Without that variable (processes started one by one, tests, benchmarks) the values
live in the process's own registry and /metrics shows the front's alone. Set it yourself (the same empty
directory for every process of one service) to merge processes started by a Procfile.

Hot paths record per batch, never per token: a worker calls WorkerMetrics.batch() once per TokenBatch (histograms)
and sync() at its stats interval, which turns the plain-int counters the worker keeps anyway into counter values.
The front holds its per-request values the same way (FrontMetrics) and writes them at each sweep and scrape.

Metric families (labels in braces; `tokenizer` is the backend type, e.g. hf, tiktoken, sentencepiece):
- tokenizer: detok_tokenizer_{encode,decode}_duration_seconds{tokenizer,operation},
  detok_tokenizer_{tokens,chars}_per_encode{tokenizer}, detok_tokenizer_load_duration_seconds{tokenizer,role}
- streams: detok_stream_tokens_total, detok_stream_holds_total, detok_stop_sequences_detected_total{...,kind}
  (all {tokenizer,worker})
- worker: detok_worker_{tokens_in,chars_out}_total, detok_worker_batch_rids, detok_worker_batch_tokens,
  detok_worker_step_duration_seconds (all {worker}), detok_worker_restarts_total{worker}
- every process: detok_live_rids{role,worker}, detok_bad_frames_total{role,worker,kind}
- engine: detok_reopened_rids_total; front: detok_requests_total{endpoint}, detok_aborted_requests_total{cause},
  detok_sse_clients, detok_front_tokens_total, detok_front_chars_total, detok_bus_latency_seconds
- front, once per HTTP request (`RequestLogMiddleware`): detok_http_responses_total{endpoint,status},
  detok_request_duration_seconds{endpoint}, detok_time_to_first_token_seconds{endpoint},
  detok_inter_token_latency_seconds{endpoint} (a request's mean); detok_front_draining
"""

from detok_worker.metrics.families import (
    ABORT_CAUSES,
    RESTART_ENV,
    Metrics,
    observe_tokenizer_load,
    record_worker_start,
    tokenizer_type,
)
from detok_worker.metrics.multiprocess import (
    CONTENT_TYPE,
    METRICS_SUBDIR,
    child_env,
    cleanup_metrics_dir,
    mark_process_dead,
    multiprocess_dir,
    prepare_metrics_dir,
    render_latest,
)
from detok_worker.metrics.recorders import (
    CounterSync,
    EngineMetrics,
    FrontMetrics,
    InstrumentedTokenizer,
    WorkerMetrics,
)

__all__ = [
    "ABORT_CAUSES",
    "CONTENT_TYPE",
    "METRICS_SUBDIR",
    "RESTART_ENV",
    "CounterSync",
    "EngineMetrics",
    "FrontMetrics",
    "InstrumentedTokenizer",
    "Metrics",
    "WorkerMetrics",
    "child_env",
    "cleanup_metrics_dir",
    "mark_process_dead",
    "multiprocess_dir",
    "observe_tokenizer_load",
    "prepare_metrics_dir",
    "record_worker_start",
    "render_latest",
    "tokenizer_type",
]
