"""`detok trace synth | inspect | replay | record` as real commands (replay and record start real processes)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.serve_helpers import REPO, wait_for

from detok_worker.trace.format import read_trace, tokenizer_fingerprint


def detok(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "detok_worker.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )
    return result


def expected_text(tokenizer: Any, output_ids: list[int]) -> tuple[str, int]:
    """Decode of the recorded ids up to the first EOS (a hidden stop token, counted in n_tokens)."""
    eos = set(tokenizer.eos_token_ids)
    for index, token_id in enumerate(output_ids):
        if token_id in eos:
            return tokenizer.decode(output_ids[:index], skip_special_tokens=True), index + 1
    return tokenizer.decode(output_ids, skip_special_tokens=True), len(output_ids)


@pytest.fixture(scope="module")
def corpus_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "corpus.trace"
    result = detok("trace", "synth", "-o", str(path), "--requests", "24", "--max-tokens", "40", "--seed", "3",
                   "--rate", "500")  # fmt: skip
    assert result.returncode == 0, result.stderr
    return path


def test_synth_from_corpus(corpus_trace: Path, tokenizer: Any) -> None:
    trace = read_trace(corpus_trace)
    assert len(trace.requests) == 24
    assert trace.header.tokenizer_hash == tokenizer_fingerprint(tokenizer)
    finishes = {request.finish for request in trace.requests}
    assert finishes <= {"stop", "length"} and "length" in finishes
    for request in trace.requests:
        assert 0 < len(request.output_ids) <= 40
        assert len(request.token_times_ns) == len(request.output_ids)
        assert request.token_times_ns == sorted(request.token_times_ns)
        assert request.prompt_ids and request.params.max_tokens == 40
    assert len({request.t_ns for request in trace.requests}) > 1  # Poisson arrivals, not all at once


def test_synth_is_deterministic(corpus_trace: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.trace"
    result = detok("trace", "synth", "-o", str(again), "--requests", "24", "--max-tokens", "40", "--seed", "3",
                   "--rate", "500")  # fmt: skip
    assert result.returncode == 0, result.stderr
    first, second = read_trace(corpus_trace), read_trace(again)
    assert [(r.prompt_ids, r.output_ids, r.t_ns) for r in first.requests] == [
        (r.prompt_ids, r.output_ids, r.t_ns) for r in second.requests
    ]


def test_synth_from_sharegpt(tmp_path: Path, tokenizer: Any) -> None:
    conversations = [
        {"conversations": [{"from": "human", "value": "Hi! 你好"}, {"from": "gpt", "value": "Hello 😀 there."},
                           {"from": "human", "value": "More?"}, {"from": "gpt", "value": "Sure: `code()`."}]},
        {"messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Why?"},
                      {"role": "assistant", "content": "Because."}]},
        {"conversations": [{"from": "human", "value": "no answer"}]},
    ]  # fmt: skip
    source = tmp_path / "sharegpt.json"
    source.write_text(json.dumps(conversations, ensure_ascii=False))
    path = tmp_path / "chat.trace"
    result = detok("trace", "synth", "--sharegpt", str(source), "-o", str(path), "--max-tokens", "100")
    assert result.returncode == 0, result.stderr
    requests = read_trace(path).requests
    assert len(requests) == 3  # one per assistant turn
    history = [{"role": "user", "content": "Hi! 你好"}, {"role": "assistant", "content": "Hello 😀 there."},
               {"role": "user", "content": "More?"}]  # fmt: skip
    assert (
        requests[1].prompt_ids
        == tokenizer.encode(tokenizer.apply_chat_template(history, add_generation_prompt=True)).ids
    )
    texts = [expected_text(tokenizer, request.output_ids)[0] for request in requests]
    assert texts == ["Hello 😀 there.", "Sure: `code()`.", "Because."]
    assert {request.finish for request in requests} == {"stop"}


def test_inspect(corpus_trace: Path, tmp_path: Path) -> None:
    trace = read_trace(corpus_trace)
    jsonl = tmp_path / "out.jsonl"
    result = detok("trace", "inspect", str(corpus_trace), "--json", "--jsonl", str(jsonl))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["requests"] == 24
    assert summary["output_tokens"] == sum(len(r.output_ids) for r in trace.requests)
    assert summary["source"] == "synth:corpus"
    assert sum(summary["finish"].values()) == 24
    lines = jsonl.read_text().splitlines()
    assert len(lines) == 25 and json.loads(lines[0])["type"] == "header"
    human = detok("trace", "inspect", str(corpus_trace))
    assert human.returncode == 0 and re.search(r"^requests\s+24$", human.stdout, re.M)


def test_inspect_rejects_a_non_trace(tmp_path: Path) -> None:
    junk = tmp_path / "junk.trace"
    junk.write_bytes(b"\x05\x00\x00\x00hello world")
    result = detok("trace", "inspect", str(junk))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and str(junk) in result.stderr


def replay(path: Path, workers: int) -> dict[str, Any]:
    result = detok("trace", "replay", str(path), "--workers", str(workers), "--json", "--texts", "--replay-speed", "0",
                   "--step-interval-ms", "0", "--timeout", "120")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_replay_through_one_and_two_workers_gives_the_direct_decodes(corpus_trace: Path, tokenizer: Any) -> None:
    trace = read_trace(corpus_trace)
    one, two = replay(corpus_trace, 1), replay(corpus_trace, 2)
    assert one["requests"] == two["requests"]
    by_rid = {request["rid"]: request for request in one["requests"]}
    assert len(by_rid) == len(trace.requests)
    for recorded in trace.requests:
        text, n_tokens = expected_text(tokenizer, recorded.output_ids)
        got = by_rid[recorded.rid]
        assert got["text"] == text
        assert got["finish"] == recorded.finish
        assert got["n_tokens"] == n_tokens
    for report in (one, two):
        summary = report["summary"]
        assert summary["finished"] == summary["requests"] == 24
        assert summary["tokens"] == sum(r["n_tokens"] for r in report["requests"])
        assert summary["gaps"] == 0 and summary["errors"] == 0
        assert summary["latency_p99_ms"] >= summary["latency_p50_ms"] > 0
    assert one["summary"]["workers"] == 1 and two["summary"]["workers"] == 2


def test_record_a_live_service(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "live.trace"
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "detok_worker.cli", "trace", "record", "-o", str(path), "--port", "0", "--workers", "1",
         "--source", "echo", "--step-interval-ms", "1"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://\S+", line).group(0)
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        prompt = "Record me: 録音 🎙️"
        body = {"model": model, "prompt": prompt, "max_tokens": 64}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200
        assert response.json()["choices"][0]["text"] == prompt
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert proc.returncode == 0
    trace = wait_for(lambda: path.exists() and read_trace(path), 5, what="the recorded trace")
    assert len(trace.requests) == 1
    recorded = trace.requests[0]
    assert recorded.prompt_ids == tokenizer.encode(prompt, add_special_tokens=True).ids
    assert expected_text(tokenizer, recorded.output_ids)[0] == prompt
    assert recorded.finish == "stop"


def test_replay_refuses_a_trace_of_another_tokenizer(corpus_trace: Path) -> None:
    other = REPO / "tests" / "fixtures" / "tokenizers" / "deepseek-v3"
    result = detok("trace", "replay", str(corpus_trace), "--tokenizer", str(other), "--workers", "1")
    assert result.returncode == 1
    assert "--tokenizer" in result.stderr and "Traceback" not in result.stderr
