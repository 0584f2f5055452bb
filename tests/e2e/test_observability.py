"""Observability of a real `detok serve --source echo`: the access log (one line per request, a stream's when it
ends, a refused one's with its status and cause), and the per-request metrics (HTTP responses by endpoint and
status, request duration, TTFT, inter-token latency, drain state). The client's X-Request-Id in a worker's log line
about its failed request: tests/faults/test_params.py (workers with their own limits).

The echo source generates the prompt's ids then EOS, so every completion's token count is known: prompt + 1.
worker.max_live_stop_chars is set to 8 so that a request with a longer stop string is refused (by the engine, which
places requests on workers with room for their stop strings: this one fits on none, ever)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.metrics_scrape import scrape, total, wait_for_value
from helpers.serve_helpers import ServeProcess, serving, wait_for

ENDPOINT = "/v1/completions"
ACCESS_LINE = re.compile(r" detok\.access: (.*)$")
PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hello there, how are you today?"]
LONG_PROMPT = "word " * 1500  # ~3 s of output at 2 ms per step: still streaming when its client leaves


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving(
        "--workers", "1", "--source", "echo", "--step-interval-ms", "2",
        "--set", "worker.max_live_stop_chars=8", "--set", "front.max_tokens_limit=4096",
    ) as serve:  # fmt: skip
        yield serve


def access_lines(service: ServeProcess, request_id: str) -> list[dict[str, str]]:
    """The access log lines of `request_id`, as field -> value."""
    found = []
    for line in service.log(None).splitlines():
        match = ACCESS_LINE.search(line)
        if match:
            fields = dict(field.split("=", 1) for field in shlex.split(match.group(1)))
            if fields["request_id"] == request_id:
                found.append(fields)
    return found


def access_line(service: ServeProcess, request_id: str) -> dict[str, str]:
    """The one access log line of `request_id` (it is written when the response ends: wait for it)."""
    lines = wait_for(lambda: access_lines(service, request_id), 10, what=f"the access log line of {request_id}")
    assert len(lines) == 1, lines
    return lines[0]


def post(url: str, request_id: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{ENDPOINT}", json=body, headers={"X-Request-Id": request_id}, timeout=30.0)


def stream(url: str, request_id: str, prompt: str) -> dict[str, Any]:
    """A streamed completion read to its end; returns its usage."""
    body = {"prompt": prompt, "max_tokens": 512, "stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with httpx.stream(
        "POST", f"{url}{ENDPOINT}", json=body, headers={"X-Request-Id": request_id}, timeout=30.0
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith('data: {"id"') and '"usage":{' in line:
                usage = json.loads(line[len("data: ") :])["usage"]
    assert usage is not None
    return usage


def test_access_log_and_metrics_of_known_requests(service: ServeProcess) -> None:
    url = service.url
    before = scrape(url)
    answers = {f"obs-ok-{i}": post(url, f"obs-ok-{i}", {"prompt": prompt}) for i, prompt in enumerate(PROMPTS)}
    stream_usage = stream(url, "obs-stream-0", "Streaming, one line when it ends.")
    refused = {f"obs-bad-{i}": post(url, f"obs-bad-{i}", {"prompt": "Hi", "max_tokens": -1}) for i in range(2)}

    for request_id, answer in answers.items():
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        assert usage["completion_tokens"] == usage["prompt_tokens"] + 1  # echo: the prompt, then EOS
        line = access_line(service, request_id)
        assert line["status"] == "200"
        assert (line["method"], line["path"], line["end"]) == ("POST", ENDPOINT, "stop")
        assert line["rid"] == answer.json()["id"] and line["rid"].startswith(f"cmpl-{request_id}-")
        assert int(line["prompt_tokens"]) == usage["prompt_tokens"]
        assert int(line["completion_tokens"]) == usage["completion_tokens"]
        assert 0 < float(line["ttft_ms"]) <= float(line["duration_ms"])
        assert line["client"].startswith("127.0.0.1:")
    line = access_line(service, "obs-stream-0")
    assert (line["status"], line["end"]) == ("200", "stop")
    assert int(line["completion_tokens"]) == stream_usage["completion_tokens"] == stream_usage["prompt_tokens"] + 1
    for request_id, answer in refused.items():
        assert answer.status_code == 400
        line = access_line(service, request_id)
        assert (line["status"], line["rid"], line["completion_tokens"], line["ttft_ms"]) == ("400", "-", "-", "-")

    generated = len(answers) + 1
    after = wait_for_value(
        url, "detok_http_responses_total", total(before, "detok_http_responses_total", status="400") + 2, status="400"
    )

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("detok_http_responses_total", endpoint=ENDPOINT, status="200") == generated
    assert grew("detok_http_responses_total", endpoint=ENDPOINT, status="400") == len(refused)
    assert grew("detok_request_duration_seconds_count", endpoint=ENDPOINT) == generated + len(refused)
    assert grew("detok_time_to_first_token_seconds_count", endpoint=ENDPOINT) == generated
    # one mean per request: every answer here has tokens after its first delta (one token per engine step)
    assert grew("detok_inter_token_latency_seconds_count", endpoint=ENDPOINT) == generated
    assert grew("detok_http_responses_total", endpoint="/v1/models/{model:path}") == 0
    assert total(after, "detok_front_draining") == 0


def test_route_template_and_unmatched_paths_label_responses(service: ServeProcess) -> None:
    url = service.url
    before = scrape(url)
    assert httpx.get(f"{url}/v1/models/no-such-model").status_code == 404
    assert httpx.get(f"{url}/no/such/path").status_code == 404
    after = wait_for_value(
        url,
        "detok_http_responses_total",
        total(before, "detok_http_responses_total", endpoint="unmatched") + 1,
        endpoint="unmatched",
    )
    model_404 = {"endpoint": "/v1/models/{model:path}", "status": "404"}
    grown = total(after, "detok_http_responses_total", **model_404) - total(
        before, "detok_http_responses_total", **model_404
    )
    assert grown == 1
    assert not any("no-such-model" in value for _, labels in after for _, value in labels)


def test_stream_left_by_its_client_is_logged_once_when_it_ends(service: ServeProcess) -> None:
    body = {"prompt": LONG_PROMPT, "max_tokens": 4096, "stream": True}
    headers = {"X-Request-Id": "obs-leaves-0"}
    with httpx.stream("POST", f"{service.url}{ENDPOINT}", json=body, headers=headers, timeout=30.0) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith('data: {"id"'))
    line = access_line(service, "obs-leaves-0")
    assert (line["status"], line["end"]) == ("200", "disconnected")
    assert 0 < int(line["completion_tokens"]) < 1500


def test_a_request_refused_before_any_output_is_logged_with_its_status_and_cause(service: ServeProcess) -> None:
    for request_id, stream in (("obs-refused-stop", False), ("obs-refused-stream", True)):
        body = {"prompt": "Hello", "stop": ["a stop string of 28 characters"], "stream": stream}
        answer = post(service.url, request_id, body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_request"
        assert "worker.max_live_stop_chars" in answer.json()["error"]["message"]
        line = access_line(service, request_id)
        assert (line["status"], line["end"], line["completion_tokens"]) == ("400", "invalid_request", "0")
        assert line["rid"].startswith(f"cmpl-{request_id}-")
