"""FrontMetrics and InstrumentedTokenizer hold their values until flush(): after it, the exposition is exactly what
direct Prometheus calls would have produced; before it, nothing of theirs is written."""

from __future__ import annotations

import threading

from helpers.fixtures import load_fixture_tokenizer
from prometheus_client import CollectorRegistry, generate_latest

from detok_worker.metrics import ABORT_CAUSES, FrontMetrics, InstrumentedTokenizer, Metrics

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# (endpoint, status, seconds, ttft, itl) per response; ttft None = not a generation request
RESPONSES = [
    (CHAT, 200, 0.4, 0.02, 0.001),
    (CHAT, 200, 12.0, 0.3, None),
    (COMPLETIONS, 400, 0.0007, None, None),
    (CHAT, 499, 700.0, 0.0, 0.02),
    ("unmatched", 404, 0.001, None, None),
    (COMPLETIONS, 200, 0.05, 2.5, 0.0001),
]


def drive(recorder: FrontMetrics, rounds: list[list[int]], flush: bool) -> None:
    """The same per-request calls in several rounds (a sweep or scrape between them when flush)."""
    for round_ in rounds:
        for index in round_:
            endpoint, status, seconds, ttft, itl = RESPONSES[index]
            recorder.sse_opened()
            if ttft is not None:
                recorder.request(endpoint)
                recorder.bus_latency(seconds / 100)
            if status == 499:
                recorder.aborted("client_disconnected")
            recorder.response(endpoint, status, seconds)
            recorder.generation(endpoint, ttft, itl)
            if index % 2:
                recorder.sse_closed()  # the others stay open
        if flush:
            recorder.flush()


def direct(m: Metrics, rounds: list[list[int]]) -> None:
    """What the front wrote before its values were held: one Prometheus call per event."""
    for cause in ABORT_CAUSES:
        m.aborted.labels(cause)
    for index in [index for round_ in rounds for index in round_]:
        endpoint, status, seconds, ttft, itl = RESPONSES[index]
        m.sse_clients.inc()
        if ttft is not None:
            m.requests.labels(endpoint).inc()
            m.bus_latency.observe(seconds / 100)
        if status == 499:
            m.aborted.labels("client_disconnected").inc()
        m.http_responses.labels(endpoint, str(status)).inc()
        m.request_seconds.labels(endpoint).observe(seconds)
        if ttft is not None:
            m.ttft_seconds.labels(endpoint).observe(ttft)
        if itl is not None:
            m.itl_seconds.labels(endpoint).observe(itl)
        if index % 2:
            m.sse_clients.dec()


def exposition(registry: CollectorRegistry, names: set[str]) -> list[str]:
    """The exposition lines of the named families, without the _created timestamps."""
    lines = generate_latest(registry).decode().splitlines()
    return [
        line for line in lines if any(line.startswith(name) for name in names) and "_created" not in line.split("{")[0]
    ]


def front_families(m: Metrics) -> set[str]:
    collectors = (
        m.requests,
        m.aborted,
        m.http_responses,
        m.request_seconds,
        m.ttft_seconds,
        m.itl_seconds,
        m.bus_latency,
        m.sse_clients,
    )
    return {family.name for collector in collectors for family in collector.describe()}


def test_front_metrics_write_at_flush_exactly_what_direct_calls_would_have() -> None:
    rounds = [[0, 2, 3], [], [1, 4, 5, 0], [3]]
    held_registry, direct_registry = CollectorRegistry(), CollectorRegistry()
    held_metrics, direct_metrics = Metrics(held_registry), Metrics(direct_registry)
    names = front_families(held_metrics)
    direct(direct_metrics, rounds)
    expected = exposition(direct_registry, names)
    assert any(line.startswith("detok_http_responses_total") for line in expected)

    recorder = FrontMetrics(held_metrics)
    drive(recorder, rounds, flush=False)
    assert held_registry.get_sample_value("detok_request_duration_seconds_count", {"endpoint": CHAT}) == 0
    assert held_registry.get_sample_value("detok_sse_clients") == 0
    assert exposition(held_registry, names) != expected  # nothing written without a flush
    recorder.flush()
    assert exposition(held_registry, names) == expected

    held_registry = CollectorRegistry()
    held_metrics = Metrics(held_registry)
    drive(FrontMetrics(held_metrics), rounds, flush=True)  # a flush after each round: the same totals
    assert exposition(held_registry, names) == expected
    assert held_registry.get_sample_value("detok_http_responses_total", {"endpoint": CHAT, "status": "200"}) == 3
    assert held_registry.get_sample_value("detok_sse_clients") == 4  # 8 opened, 4 closed


def test_instrumented_tokenizer_holds_its_observations_until_flush_across_threads() -> None:
    registry = CollectorRegistry()
    tokenizer = load_fixture_tokenizer("qwen3")
    instrumented = InstrumentedTokenizer(tokenizer, Metrics(registry))
    text = "Hello 😀 world, 日本語"
    size = len(tokenizer.encode(text).ids)
    threads = [threading.Thread(target=lambda: [instrumented.encode(text) for _ in range(100)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    instrumented.encode_batch([text, text])
    for thread in threads:
        thread.join()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"tokenizer": "hf", **labels})

    assert value("detok_tokenizer_tokens_per_encode_count") == 0
    instrumented.flush()
    assert value("detok_tokenizer_encode_duration_seconds_count", operation="encode") == 400
    assert value("detok_tokenizer_encode_duration_seconds_count", operation="encode_batch") == 1
    assert value("detok_tokenizer_tokens_per_encode_count") == 402
    assert value("detok_tokenizer_tokens_per_encode_sum") == 402 * size
    assert value("detok_tokenizer_chars_per_encode_sum") == 402 * len(text)
    instrumented.flush()  # nothing new: the totals stay
    assert value("detok_tokenizer_tokens_per_encode_count") == 402
