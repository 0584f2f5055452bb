"""detok_worker.metrics without a service: multiprocess merging across real processes, the per-role recorders,
tokenizer type labels, and the instrumented tokenizer (same results as the tokenizer it wraps)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.fixtures import REPO, load_fixture_tokenizer
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from detok_worker import metrics as m
from detok_worker.metrics.recorders import HeldHistogram
from detok_worker.worker.state import COUNTS, WorkerState

# A worker-like process: records one batch and syncs its counters, then exits.
CHILD = """
import sys
from detok_worker.metrics import WorkerMetrics, record_worker_start
worker, tokens = sys.argv[1], int(sys.argv[2])
record_worker_start(worker)
recorder = WorkerMetrics(worker, object())
recorder.batch(rids=2, tokens=tokens, decode_s=0.001, step_s=0.002)
recorder.sync(counts={"tokens_in": tokens, "chars_out": 3 * tokens, "unknown_ids": 1}, stops={"string": 1},
              live_rids=2, bad_frames={"schema": 1})
"""

RENDER = "import sys; from detok_worker.metrics import render_latest; sys.stdout.buffer.write(render_latest())"


def run_python(code: str, *args: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def samples_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_values_of_processes_are_merged_and_dead_ones_drop_their_live_gauges(tmp_path: Path) -> None:
    metrics_dir = m.prepare_metrics_dir(tmp_path)
    assert metrics_dir == tmp_path / m.METRICS_SUBDIR and not any(metrics_dir.iterdir())
    env_w0 = m.child_env(metrics_dir)
    env_w1 = m.child_env(metrics_dir, restarts=1)
    assert m.RESTART_ENV not in env_w0 and env_w1[m.RESTART_ENV] == "1"
    first = subprocess.Popen([sys.executable, "-c", CHILD, "w0", "5"], cwd=REPO, env={**os.environ, **env_w0})
    assert first.wait(60) == 0
    run_python(CHILD, "w0", "7", env=env_w1)  # the same worker slot, restarted
    run_python(CHILD, "w1", "11", env=env_w0)

    samples = samples_of(run_python(RENDER, env=env_w0))
    assert samples[("detok_worker_tokens_in_total", frozenset({("worker", "w0")}))] == 12
    assert samples[("detok_worker_tokens_in_total", frozenset({("worker", "w1")}))] == 11
    assert samples[("detok_worker_chars_out_total", frozenset({("worker", "w0")}))] == 36
    assert samples[("detok_worker_unknown_ids_total", frozenset({("worker", "w0")}))] == 2
    assert samples[("detok_worker_restarts_total", frozenset({("worker", "w0")}))] == 1
    assert samples[("detok_worker_restarts_total", frozenset({("worker", "w1")}))] == 0
    assert samples[("detok_worker_batch_tokens_count", frozenset({("worker", "w0")}))] == 2
    assert samples[("detok_worker_batch_tokens_sum", frozenset({("worker", "w0")}))] == 12
    string_stops = ("detok_stop_sequences_detected_total", frozenset({("tokenizer", "object"), ("worker", "w1")}))
    assert samples[(string_stops[0], string_stops[1] | {("kind", "string")})] == 1
    bad = ("detok_bad_frames_total", frozenset({("role", "worker"), ("worker", "w0"), ("kind", "schema")}))
    assert samples[bad] == 2
    live = ("detok_live_rids", frozenset({("role", "worker"), ("worker", "w0")}))
    assert samples[live] == 4  # both w0 processes left their gauge files behind: until marked dead they count

    m.mark_process_dead(first.pid, metrics_dir)  # what the supervisor does when a child exits
    samples = samples_of(run_python(RENDER, env=env_w0))
    assert samples[live] == 2  # only that process's live gauges went; counters keep their totals
    assert samples[("detok_worker_tokens_in_total", frozenset({("worker", "w0")}))] == 12

    m.cleanup_metrics_dir(metrics_dir)
    assert not metrics_dir.exists()


def test_counter_sync_turns_cumulative_counts_into_increments() -> None:
    registry = CollectorRegistry()
    counter = Counter("sync_probe", "probe", ["role", "kind"], registry=registry)
    sync = m.CounterSync(counter, "worker")
    sync.sync({"schema": 2})
    sync.sync({"schema": 2, "multipart": 1})
    sync.sync({"schema": 5, "multipart": 1})
    assert registry.get_sample_value("sync_probe_total", {"role": "worker", "kind": "schema"}) == 5
    assert registry.get_sample_value("sync_probe_total", {"role": "worker", "kind": "multipart"}) == 1


def test_held_histogram_writes_what_observe_would_have() -> None:
    registry = CollectorRegistry()
    family = Histogram("x_seconds", "x", ["worker"], buckets=(0.001, 0.01, 0.1, 1.0), registry=registry)
    direct, held = family.labels("direct"), HeldHistogram(family.labels("held"))
    amounts = [0.0, 0.001, 0.0011, 0.01, 0.05, 0.1, 0.5, 1.0, 7.0, 1e9, 0.0005, 0.0005]
    for amount in amounts[:7]:
        direct.observe(amount)
        held.observe(amount)
    assert registry.get_sample_value("x_seconds_count", {"worker": "held"}) == 0  # nothing written before flush
    held.flush()
    for amount in amounts[7:]:
        direct.observe(amount)
        held.observe(amount)
    held.flush()
    held.flush()  # nothing new: writes nothing
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }
    for (name, labels), value in samples.items():
        if ("worker", "direct") in labels:
            twin = tuple(("worker", "held") if label == ("worker", "direct") else label for label in labels)
            assert samples[(name, twin)] == value, name
    assert samples[("x_seconds_count", (("worker", "held"),))] == len(amounts)
    assert samples[("x_seconds_bucket", (("le", "0.001"), ("worker", "held")))] == 4  # 0, 0.001 and 2 x 0.0005


def test_tokenizer_type_label() -> None:
    from detok_worker.tokenizer.backends.mock import MockTokenizer

    hf = load_fixture_tokenizer("qwen3")
    assert m.tokenizer_type(hf) == "hf"
    assert m.tokenizer_type(MockTokenizer()) == "mock"
    assert m.tokenizer_type(m.InstrumentedTokenizer(hf)) == "hf"  # wrappers report what they wrap


def test_instrumented_tokenizer_gives_the_same_results_and_counts_calls() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    instrumented = m.InstrumentedTokenizer(tokenizer)

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"tokenizer": "hf", **labels}) or 0.0

    tokens_before = value("detok_tokenizer_tokens_per_encode_sum")
    batches_before = value("detok_tokenizer_encode_duration_seconds_count", operation="encode_batch")
    text = "Hello 😀 world, 日本語"
    ids = tokenizer.encode(text).ids
    assert instrumented.encode(text).ids == ids
    assert [e.ids for e in instrumented.encode_batch([text, "x"])] == [ids, tokenizer.encode("x").ids]
    assert instrumented.decode(ids) == tokenizer.decode(ids) == text
    assert instrumented.vocab_size == tokenizer.vocab_size and instrumented.eos_token_ids == tokenizer.eos_token_ids
    instrumented.flush()  # its observations are held until then (the front flushes at each sweep and scrape)
    added = value("detok_tokenizer_tokens_per_encode_sum") - tokens_before
    assert added == 2 * len(ids) + len(tokenizer.encode("x").ids)  # encode + the batch of two
    assert value("detok_tokenizer_encode_duration_seconds_count", operation="encode_batch") == batches_before + 1


def test_every_count_a_worker_keeps_reaches_its_metric() -> None:
    # WorkerState.counts() names each count; the recorder writes each to its own counter (one left out of the
    # recorder would be read and dropped)
    state = WorkerState(load_fixture_tokenizer("qwen3"), "w-counts")
    expected = {}
    for offset, name in enumerate(COUNTS):
        setattr(state, name, 1000 + offset)
        expected[name] = 1000 + offset
    assert state.counts() == expected
    m.WorkerMetrics("w-counts", object()).sync(counts=state.counts(), stops={}, live_rids=0, bad_frames={})
    written = {
        sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("worker") == "w-counts"
    }
    assert set(expected.values()) <= written
