"""Statistics of a trace (`detok trace inspect`) and of a replay."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def trace_summary(trace: Any) -> dict[str, Any]:
    outputs = [len(request.output_ids) for request in trace.requests]
    prompts = [len(request.prompt_ids) for request in trace.requests]
    ends = [request.token_times_ns[-1] if request.token_times_ns else request.t_ns for request in trace.requests]
    header = trace.header
    return {
        "version": header.version,
        "tokenizer": header.tokenizer,
        "tokenizer_hash": header.tokenizer_hash,
        "created": header.created,
        "source": header.source,
        "meta": header.meta,
        "requests": len(trace.requests),
        "output_tokens": sum(outputs),
        "prompt_tokens": sum(prompts),
        "output_tokens_p50": percentile(outputs, 50),
        "output_tokens_max": max(outputs, default=0),
        "prompt_tokens_mean": round(statistics.fmean(prompts), 1) if prompts else 0,
        "duration_s": round(max(ends, default=0) / 1e9, 3),
        "finish": dict(Counter(str(request.finish) for request in trace.requests)),
        "truncated": trace.truncated,
        "orphan_tokens": trace.orphan_tokens,
    }
