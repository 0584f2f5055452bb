"""Trace files: write, read back, truncation tolerance, corruption errors, JSON-lines export."""

from __future__ import annotations

import json
import struct

import msgspec
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer

from detok_worker.bus.messages import DetokParams, RequestParams
from detok_worker.tokenizer import create_tokenizer
from detok_worker.trace.format import (
    TRACE_VERSION,
    RecordedRequest,
    Trace,
    TraceFormatError,
    TraceHeader,
    TraceReader,
    TraceRequest,
    TraceTokens,
    TraceWriter,
    export_jsonl,
    make_header,
    read_trace,
    tokenizer_fingerprint,
    write_trace,
)

HEADER = TraceHeader(
    version=TRACE_VERSION, tokenizer="qwen3", tokenizer_hash="abc123", created=1700000000.5, source="test"
)
PARAMS_A = RequestParams(max_tokens=16, detok=DetokParams(stop=["\n\n", "END"], stop_token_ids=[7], min_tokens=2))
PARAMS_B = RequestParams(max_tokens=4, ignore_eos=True)


def _write_sample(path) -> None:
    with TraceWriter(path, HEADER) as writer:
        writer.request("r1", [1, 2, 3], PARAMS_A, t_ns=100)
        writer.request("r2", [9], PARAMS_B, t_ns=150)
        writer.tokens("r1", [10, 11], t_ns=200)
        writer.tokens("r2", [20], t_ns=210)
        writer.tokens("r1", [12], t_ns=300)
        writer.tokens("r2", [21, 22, 23], "length", t_ns=310)
        writer.tokens("r1", [], "stop", t_ns=320)


def test_round_trip(tmp_path):
    path = tmp_path / "t.trace"
    _write_sample(path)
    trace = read_trace(path)
    assert trace.header == HEADER
    assert not trace.truncated
    assert trace.orphan_tokens == 0
    assert trace.requests == [
        RecordedRequest("r1", 100, [1, 2, 3], PARAMS_A, [10, 11, 12], [200, 200, 300], "stop"),
        RecordedRequest("r2", 150, [9], PARAMS_B, [20, 21, 22, 23], [210, 310, 310, 310], "length"),
    ]
    assert trace.total_output_tokens == 7


def test_records_are_length_prefixed_msgpack(tmp_path):
    path = tmp_path / "t.trace"
    _write_sample(path)
    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data)
    header = msgspec.msgpack.decode(data[4 : 4 + length], type=TraceHeader)
    assert header == HEADER
    records = list(TraceReader(path))
    assert len(records) == 8
    assert isinstance(records[1], TraceRequest) and records[1].rid == "r1"
    assert isinstance(records[-1], TraceTokens) and records[-1].finish == "stop"


def test_default_times_are_monotonic(tmp_path):
    path = tmp_path / "t.trace"
    with TraceWriter(path, HEADER) as writer:
        writer.request("r", [1], PARAMS_B)
        for i in range(5):
            writer.tokens("r", [i])
    trace = read_trace(path)
    times = [trace.requests[0].t_ns, *trace.requests[0].token_times_ns]
    assert times == sorted(times) and times[0] >= 0


def test_truncated_file_reads_up_to_the_last_whole_record(tmp_path):
    path = tmp_path / "t.trace"
    _write_sample(path)
    data = path.read_bytes()
    for cut in (1, 3, 6):  # inside the last record's payload, and inside its length prefix
        path.write_bytes(data[:-cut])
        trace = read_trace(path)
        assert trace.truncated
        assert trace.requests[0].finish is None  # the final "stop" record was cut off
        assert trace.requests[1].output_ids == [20, 21, 22, 23]


def test_not_a_trace(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty"):
        read_trace(path)
    path.write_bytes(b"\xff\xff\xff\xff garbage")
    with pytest.raises(TraceFormatError):
        read_trace(path)
    path.write_bytes(struct.pack("<I", 3) + b"abc")
    with pytest.raises(TraceFormatError):
        read_trace(path)
    with pytest.raises(TraceFormatError):
        read_trace(tmp_path / "missing")
    with pytest.raises(TraceFormatError, match="cannot create"):
        TraceWriter(tmp_path / "no-such-dir" / "t.trace", HEADER)


def test_records_before_header_and_second_header_are_errors(tmp_path):
    path = tmp_path / "x"
    payload = msgspec.msgpack.encode(TraceTokens(1, "r", [1]))
    path.write_bytes(struct.pack("<I", len(payload)) + payload)
    with pytest.raises(TraceFormatError, match="header"):
        read_trace(path)
    _write_sample(path)
    header = msgspec.msgpack.encode(HEADER)
    path.write_bytes(path.read_bytes() + struct.pack("<I", len(header)) + header)
    with pytest.raises(TraceFormatError, match="second header"):
        read_trace(path)


def test_wrong_version_is_refused(tmp_path):
    path = tmp_path / "x"
    with TraceWriter(path, msgspec.structs.replace(HEADER, version=TRACE_VERSION + 1)):
        pass
    with pytest.raises(TraceFormatError, match="version"):
        read_trace(path)


def test_orphan_tokens_and_reused_rids(tmp_path):
    path = tmp_path / "t.trace"
    with TraceWriter(path, HEADER) as writer:
        writer.tokens("ghost", [1], t_ns=1)
        writer.request("r", [1], PARAMS_B, t_ns=2)
        writer.tokens("r", [5], "stop", t_ns=3)
        writer.request("r", [2], PARAMS_B, t_ns=4)
        writer.tokens("r", [6], "length", t_ns=5)
    trace = read_trace(path)
    assert trace.orphan_tokens == 1
    assert [(r.prompt_ids, r.output_ids, r.finish) for r in trace.requests] == [
        ([1], [5], "stop"),
        ([2], [6], "length"),
    ]


def test_write_trace_round_trips_a_synthesized_trace(tmp_path):
    requests = [
        RecordedRequest("b", 50, [4], PARAMS_B, [1, 2, 3], [60, 60, 90], "length"),
        RecordedRequest("a", 0, [1, 2], PARAMS_A, [7, 8], [10, 20], "stop"),
        RecordedRequest("c", 70, [], PARAMS_B, [], [], None),
    ]
    path = tmp_path / "s.trace"
    write_trace(path, Trace(HEADER, requests))
    trace = read_trace(path)
    assert sorted(trace.requests, key=lambda r: r.rid) == sorted(requests, key=lambda r: r.rid)
    times = [getattr(record, "t_ns", 0) for record in TraceReader(path)]
    assert times == sorted(times)


def test_export_jsonl(tmp_path):
    path = tmp_path / "t.trace"
    _write_sample(path)
    out = tmp_path / "t.jsonl"
    export_jsonl(read_trace(path), out)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert lines[0]["type"] == "header"
    assert lines[0]["tokenizer"] == "qwen3" and lines[0]["tokenizer_hash"] == "abc123"
    assert [line["rid"] for line in lines[1:]] == ["r1", "r2"]
    first = lines[1]
    assert first["output_ids"] == [10, 11, 12]
    assert first["token_times_ns"] == [200, 200, 300]
    assert first["finish"] == "stop"
    assert first["params"]["stop"] == ["\n\n", "END"]
    assert first["params"]["stop_token_ids"] == [7]
    assert first["params"]["min_tokens"] == 2
    assert lines[2]["params"]["ignore_eos"] is True
    assert "text" not in first


def test_header_identifies_the_tokenizer(tmp_path):
    qwen3 = load_fixture_tokenizer("qwen3")
    header = make_header(qwen3, "synth:test", {"seed": "1"})
    assert (header.version, header.tokenizer, header.source, header.meta) == (
        TRACE_VERSION,
        "qwen3",
        "synth:test",
        {"seed": "1"},
    )
    # stable across loads, different for another vocabulary
    assert tokenizer_fingerprint(create_tokenizer(str(FIXTURE_TOKENIZER_DIRS["qwen3"]))) == header.tokenizer_hash
    assert tokenizer_fingerprint(load_fixture_tokenizer("deepseek-v3")) != header.tokenizer_hash


def test_export_jsonl_with_decoded_text(tmp_path):
    qwen3 = load_fixture_tokenizer("qwen3")
    text = "Hello 👋 世界"
    path = tmp_path / "t.trace"
    with TraceWriter(path, HEADER) as writer:
        writer.request("r", [1], PARAMS_B, t_ns=1)
        writer.tokens("r", qwen3.encode(text).ids, "stop", t_ns=2)
    out = tmp_path / "t.jsonl"
    export_jsonl(read_trace(path), out, qwen3)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert lines[1]["text"] == text
