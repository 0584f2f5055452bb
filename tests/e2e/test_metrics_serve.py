"""GET /metrics of a real `detok serve --workers 2 --source echo` after known traffic: the families exist and their
values match what was sent (request counts, prompt and output tokens, characters, stops, aborts, a bad frame,
SSE clients, a worker restart). The echo source makes every output computable here: the prompt's ids, then EOS.

Worker and engine counters reach the metrics files at their stats interval (set to 0.1 s here), so every value
check polls until it matches or a deadline passes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zmq
from helpers.metrics_scrape import Samples, present, scrape, total, wait_for_value
from helpers.serve_helpers import ServeProcess, serving, wait_for

COMPLETION_PROMPTS = [f"The quick brown fox number {i} jumps over the lazy dog. Done." for i in range(3)]
STOP_PROMPTS = [f"Count {i}: one two three STOP four five" for i in range(2)]
CHAT_TEXTS = ["Hello there! How are you today? 😀", "日本語のテキスト and English"]
LONG_PROMPT = "word " * 1500  # ~3 s of output at 2 ms per step: still streaming when the client leaves


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving(
        "--workers", "2", "--source", "echo", "--step-interval-ms", "2",
        "--set", "worker.stats_interval_s=0.1", "--set", "front.max_tokens_limit=4096",
    ) as serve:  # fmt: skip
        yield serve


def complete(url: str, model: str, prompt: str, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": 512, **extra}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=30.0)
    assert response.status_code == 200, response.text
    return response.json()


def stream_completion(url: str, model: str, prompt: str, **extra: Any) -> tuple[str, dict[str, Any], Any]:
    """(text, usage, stop_reason) of a streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": 512, "stream": True, **extra}
    body["stream_options"] = {"include_usage": True}
    text, usage, stop_reason = "", None, None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30.0) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            for choice in chunk.get("choices", []):
                text += choice["text"]
                stop_reason = choice.get("stop_reason", stop_reason)
            usage = chunk.get("usage") or usage
    assert usage is not None
    return text, usage, stop_reason


def test_metrics_after_traffic(service: ServeProcess) -> None:
    url = service.url
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    prompt_tokens = completion_tokens = chars = 0

    for prompt in COMPLETION_PROMPTS:
        answer = complete(url, model, prompt)
        assert answer["choices"][0]["text"] == prompt  # echo: the prompt comes back, then EOS (hidden)
        prompt_tokens += answer["usage"]["prompt_tokens"]
        completion_tokens += answer["usage"]["completion_tokens"]
        chars += len(answer["choices"][0]["text"])
    for prompt in STOP_PROMPTS:
        text, usage, stop_reason = stream_completion(url, model, prompt, stop=["STOP"])
        assert stop_reason == "STOP" and text == prompt.split("STOP")[0]
        prompt_tokens += usage["prompt_tokens"]
        completion_tokens += usage["completion_tokens"]
        chars += len(text)
    for content in CHAT_TEXTS:
        body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 512}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30.0)
        assert response.status_code == 200, response.text
        answer = response.json()
        prompt_tokens += answer["usage"]["prompt_tokens"]
        completion_tokens += answer["usage"]["completion_tokens"]
        chars += len(answer["choices"][0]["message"]["content"])
    n_requests = len(COMPLETION_PROMPTS) + len(STOP_PROMPTS) + len(CHAT_TEXTS)

    # Worker-side counters arrive at the stats interval; wait for the last of them, then check the rest at once.
    # A stats tick can fall inside a batch (the worker ticks between items), writing its counts before the batch's
    # histograms: so also wait for a scrape where the batch histogram has caught up with the token counter.
    def settled() -> Samples | None:
        samples = scrape(url)
        tokens_in = total(samples, "detok_worker_tokens_in_total")
        if total(samples, "detok_stream_tokens_total") != completion_tokens:
            return None
        return samples if total(samples, "detok_worker_batch_tokens_sum") == tokens_in else None

    samples = wait_for(settled, 10.0, interval=0.1, what="worker counters and batch histograms settled")
    assert total(samples, "detok_requests_total", endpoint="/v1/completions") == len(COMPLETION_PROMPTS) + len(
        STOP_PROMPTS
    )
    assert total(samples, "detok_requests_total", endpoint="/v1/completions") + total(
        samples, "detok_requests_total", endpoint="/v1/chat/completions"
    ) == pytest.approx(n_requests)
    assert total(samples, "detok_front_tokens_total") == completion_tokens
    assert total(samples, "detok_front_chars_total") == chars
    assert total(samples, "detok_worker_chars_out_total") == chars
    assert total(samples, "detok_worker_tokens_in_total") >= completion_tokens
    assert total(samples, "detok_stop_sequences_detected_total", kind="string") == len(STOP_PROMPTS)
    # every other request ended at EOS, a (hidden) stop token found by the worker
    assert total(samples, "detok_stop_sequences_detected_total", kind="token") == n_requests - len(STOP_PROMPTS)
    # prompt side: one encode per string prompt and per rendered chat, one template render per chat
    assert total(samples, "detok_tokenizer_encode_duration_seconds_count", operation="encode") == n_requests
    assert total(samples, "detok_tokenizer_encode_duration_seconds_count", operation="chat_template") == len(CHAT_TEXTS)
    assert total(samples, "detok_tokenizer_tokens_per_encode_sum") == prompt_tokens
    assert total(samples, "detok_tokenizer_chars_per_encode_count") == n_requests
    assert total(samples, "detok_tokenizer_load_duration_seconds_count", role="worker") == 2
    assert total(samples, "detok_tokenizer_load_duration_seconds_count", role="front") == 1
    # per-batch histograms (their token sum matched the token counter in settled()): one step per batch
    assert total(samples, "detok_worker_step_duration_seconds_count") == total(samples, "detok_worker_batch_rids_count")
    assert total(samples, "detok_tokenizer_decode_duration_seconds_count", operation="stream_batch") > 0
    assert total(samples, "detok_bus_latency_seconds_count") > 0
    for name in (
        "detok_stream_holds_total",
        "detok_worker_unknown_ids_total",
        "detok_reopened_rids_total",
        "detok_aborted_requests_total",
        "detok_worker_restarts_total",
    ):
        assert present(samples, name), name
    samples = wait_for_value(url, "detok_live_rids", 0, role="worker")
    assert total(samples, "detok_sse_clients") == 0


def test_sse_clients_and_abort_by_cause(service: ServeProcess) -> None:
    url = service.url
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    before = total(scrape(url), "detok_aborted_requests_total", cause="client_disconnected")
    body = {"model": model, "prompt": LONG_PROMPT, "max_tokens": 4096, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30.0) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        samples = scrape(url)
        assert total(samples, "detok_sse_clients") == 1
        assert total(samples, "detok_live_rids", role="front") in (0, 1)  # synced every 0.5 s
    # the client left mid-stream: the front aborts the request in the engine
    wait_for_value(url, "detok_aborted_requests_total", before + 1, cause="client_disconnected")
    wait_for_value(url, "detok_sse_clients", 0)


def test_bad_frame_is_counted(service: ServeProcess) -> None:
    url = service.url
    before = total(scrape(url), "detok_bad_frames_total", role="front", kind="undecodable")
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(f"ipc://{service.runtime_dir}/front.sock")
        push.send(b"\xc1 not msgpack")
        push.close()
    finally:
        context.term()
    wait_for_value(url, "detok_bad_frames_total", before + 1, role="front", kind="undecodable")


def test_worker_restart_is_counted(service: ServeProcess) -> None:
    url = service.url
    workers = service.child_pids("worker")
    assert len(workers) == 2
    victim = workers[0]
    worker_id = service.children()[victim].split("--id ")[1].split()[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(service.child_pids("worker")) == 2 and victim not in service.child_pids("worker"), 20)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        samples = scrape(url)
        if total(samples, "detok_worker_restarts_total", worker=worker_id) == 1:
            break
        time.sleep(0.1)
    assert total(samples, "detok_worker_restarts_total", worker=worker_id) == 1
    assert total(samples, "detok_worker_restarts_total") == 1
