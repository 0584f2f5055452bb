"""The planning sources (corpus, echo, trace), the shipped corpus, the factory that picks a source, and the
PlannedEngine that generates their plans (tests/unit/engine/test_scheduler.py runs it with the Scheduler)."""

from __future__ import annotations

import re

import pytest

from detok_worker.bus.messages import RequestParams
from detok_worker.config import load_config
from detok_worker.config.schema import ENGINE_SOURCES
from detok_worker.engine.sources.base import RunOptions, SourceError
from detok_worker.engine.sources.factory import LOCAL_SOURCES, RELAY_SOURCES, engine_run, run_source
from detok_worker.errors import OperatorError
from detok_worker.trace.format import TRACE_VERSION, RecordedRequest, Trace, TraceHeader, write_trace
from engine_stub.local import create_local_source
from engine_stub.planned import (
    CorpusSource,
    EchoSource,
    PlannedEngine,
    TraceSource,
    load_corpus,
    primary_eos_id,
    split_passages,
)

PARAMS = RequestParams(max_tokens=100)


def test_split_passages_keeps_blank_lines_inside_a_passage():
    text = "first line\n\nstill first\n%%\n\n%%\ndef f():\n\n    pass\n%%  \nlast"
    assert split_passages(text) == ["first line\n\nstill first", "def f():\n\n    pass", "last"]


def test_shipped_corpus_is_multilingual():
    corpus = "\n".join(load_corpus())
    checks = {
        "ZWJ emoji sequence": "\u200d",
        "flag (regional indicators)": r"[\U0001F1E6-\U0001F1FF]{2}",
        "skin tone modifier": r"[\U0001F3FB-\U0001F3FF]",
        "variation selector": "\ufe0f",
        "CJK ideographs": r"[\u4e00-\u9fff]",
        "kana": r"[\u3040-\u30ff]",
        "hangul": r"[\uac00-\ud7a3]",
        "astral CJK": r"[\U00020000-\U0003134F]",
        "Arabic": r"[\u0600-\u06ff]",
        "Thai": r"[\u0e00-\u0e7f]",
        "code": r"def \w+\(",
    }
    missing = [name for name, pattern in checks.items() if not re.search(pattern, corpus)]
    assert not missing
    assert len(load_corpus()) >= 20


def test_custom_corpus_dir_and_errors(tmp_path):
    (tmp_path / "a.txt").write_text("alpha\n%%\nbeta", encoding="utf-8")
    (tmp_path / "b.txt").write_text("gamma", encoding="utf-8")
    (tmp_path / "ignored.md").write_text("not a passage", encoding="utf-8")
    assert load_corpus(tmp_path) == ["alpha", "beta", "gamma"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError):
        load_corpus(empty)
    (empty / "bad.txt").write_bytes(b"\xff\xfe\xfa")
    with pytest.raises(SourceError):
        load_corpus(empty)


def test_eos_choice(qwen3):
    eos = primary_eos_id(qwen3)
    assert eos in qwen3.eos_token_ids
    assert qwen3.id_to_token(eos) == qwen3.special_tokens.eos


def test_echo_source(qwen3):
    eos = primary_eos_id(qwen3)
    assert EchoSource(eos).plan("r", [5, 6, 7], PARAMS).ids == [5, 6, 7, eos]
    assert EchoSource(None).plan("r", [5], PARAMS).ids == [5]


def test_corpus_source_is_seeded_per_rid(qwen3):
    passages = load_corpus()
    eos = primary_eos_id(qwen3)
    source = CorpusSource(qwen3, passages, eos, seed=1)
    again = CorpusSource(qwen3, passages, eos, seed=1)
    other_seed = CorpusSource(qwen3, passages, eos, seed=2)
    rids = [f"cmpl-{i}" for i in range(30)]
    plans = [source.plan(rid, [], PARAMS) for rid in rids]
    assert plans == [again.plan(rid, [], PARAMS) for rid in rids]
    assert plans != [other_seed.plan(rid, [], PARAMS) for rid in rids]
    assert len({tuple(plan.ids) for plan in plans}) > 5  # different rids get different texts
    for plan in plans:
        assert plan.ids[-1] == eos and plan.offsets_ns is None
        assert qwen3.decode(plan.ids[:-1]) in passages


def _trace() -> Trace:
    header = TraceHeader(TRACE_VERSION, "qwen3", "h", 0.0, "test")
    return Trace(
        header,
        [
            RecordedRequest("a", 1_000, [1], PARAMS, [10, 11, 12], [2_000, 2_000, 5_000], "stop"),
            RecordedRequest("b", 3_000, [2], PARAMS, [20], [4_000], "length"),
        ],
    )


def test_trace_source_round_robin_and_pacing():
    flat = TraceSource(_trace())
    assert [flat.plan(f"x{i}", [], PARAMS).ids for i in range(3)] == [[10, 11, 12], [20], [10, 11, 12]]
    assert flat.plan("y", [], PARAMS).offsets_ns is None
    paced = TraceSource(_trace(), speed=2.0)
    first, second = paced.plan("p", [], PARAMS), paced.plan("q", [], PARAMS)
    assert first.offsets_ns == [500, 500, 2_000]  # (token time - arrival) / speed
    assert second.offsets_ns == [500]
    with pytest.raises(SourceError):
        TraceSource(Trace(_trace().header, []))


def test_create_source_from_config(qwen3, tmp_path):
    path = tmp_path / "t.trace"
    write_trace(path, _trace())
    assert isinstance(create_local_source(load_config(None, {"engine.source": "echo"}), qwen3), EchoSource)
    assert isinstance(create_local_source(load_config(None, {"engine.source": "corpus"}), qwen3), CorpusSource)
    traced = create_local_source(load_config(None, {"engine.source": "trace", "engine.trace": str(path)}), qwen3)
    assert isinstance(traced, TraceSource) and traced.speed == 1.0


def test_the_factory_knows_every_configured_source(qwen3, tmp_path) -> None:
    assert sorted(LOCAL_SOURCES + RELAY_SOURCES) == sorted(ENGINE_SOURCES) and set(RELAY_SOURCES) < set(ENGINE_SOURCES)
    path = tmp_path / "t.trace"
    write_trace(path, _trace())
    for source in LOCAL_SOURCES:  # each is a branch of create_local_source (a model may be missing here)
        config = load_config(None, {"engine.source": source, "engine.trace": str(path) if source == "trace" else ""})
        try:
            create_local_source(config, qwen3)
        except SourceError as exc:
            assert "is not a local token source" not in str(exc), source
        assert callable(engine_run(source))


def test_replay_needs_a_local_source() -> None:
    config = load_config(None, {"engine.source": "grpc", "engine.engine_url": "grpc://127.0.0.1:1"})
    with pytest.raises(OperatorError, match="--replay"):
        run_source(config, RunOptions(replay="any.trace"))


def test_the_planned_engine_runs_max_batch_in_arrival_order_and_waits_on_a_backlog():
    engine = PlannedEngine(max_batch=2, tokens_per_step=2)
    engine.add("a", [1, 2, 3], max_tokens=10)
    engine.add("b", [4, 5, 6, 7, 8], max_tokens=4, finish="abort")  # cut: it ends "length", not "abort"
    engine.add("c", [9], max_tokens=10, logprobs=["lp9"])  # type: ignore[list-item]
    engine.add("a", [0], max_tokens=10)  # a rid it has already: ignored
    assert engine.step(0, None) == [("a", [1, 2], None, None), ("b", [4, 5], None, None)]
    held = {"b": 2}  # b's worker has not taken its last ids: b waits, a goes on
    assert engine.step(0, lambda rid: held.get(rid, 0)) == [("a", [3], "stop", None)]
    assert engine.step(0, None) == [("b", [6, 7], "length", None), ("c", [9], "stop", ["lp9"])]
    assert not engine.has_work()
    engine.add("d", [1, 2], max_tokens=10)
    engine.cancel("d")
    assert engine.step(0, None) == [] and not engine.has_work()


def test_the_planned_engine_paces_a_replayed_request_by_its_release_times():
    engine = PlannedEngine(max_batch=8, tokens_per_step=1)
    engine.add("r", [5, 6, 7], max_tokens=10, release_ns=[100, 100, 300])
    assert engine.step(50, None) == [] and engine.next_release_ns() == 100
    assert engine.step(200, None) == [("r", [5, 6], None, None)]  # both due: pacing beats tokens_per_step
    assert engine.next_release_ns() == 300
    assert engine.step(300, None) == [("r", [7], "stop", None)] and engine.next_release_ns() is None
