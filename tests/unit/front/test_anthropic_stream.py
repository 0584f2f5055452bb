"""Anthropic's Messages API on the front against a played engine: a failure after the stream started is an `error`
event in Anthropic's shape, after the text that came before it; a request the engine refuses gets its status with
Anthropic's error body; the engine's cached prompt tokens split the usage as Anthropic counts it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.front_harness import FrontUnderTest, decode_plan, running_front
from helpers.serve_helpers import named_sse_events

from detok_worker.bus.messages import Submit, TextDelta

BODY = {"model": "qwen3", "max_tokens": 32, "messages": [{"role": "user", "content": "Hello there, how are you?"}]}


@pytest.fixture(scope="module")
def front(qwen3: Any) -> Iterator[FrontUnderTest]:
    with running_front(
        qwen3, **{"front.prompt_tokens_details": True, "engine.source": "vllm", "engine.model": "m"}
    ) as f:
        yield f


def test_a_failure_mid_stream_is_an_error_event_after_the_text(front: FrontUnderTest) -> None:
    def failing(submit: Submit) -> list[TextDelta]:
        played = decode_plan(front.tokenizer, submit.rid, submit.prompt_ids[:6])
        last = played[-1]
        return [
            *played[:-1],
            TextDelta(submit.rid, last.offset, "", last.n_tokens, finish="error", error="bad token id 9999999"),
        ]

    front.set_plan(failing)
    try:
        with httpx.stream("POST", f"{front.url}/v1/messages", json={**BODY, "stream": True}, timeout=30) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
    finally:
        front.set_plan(front.echo_plan)
    kinds = [event["type"] for event in named_sse_events(lines)]
    error = named_sse_events(lines)[-1]
    assert kinds[:2] == ["message_start", "content_block_start"] and "content_block_delta" in kinds
    assert kinds[-1] == "error" and error["error"]["type"] == "api_error" and "9999999" in error["error"]["message"]
    assert "message_stop" not in kinds and not any(line.startswith("data: [DONE]") for line in lines)


def test_a_refusal_has_its_status_and_anthropics_body(front: FrontUnderTest) -> None:
    front.set_plan(lambda submit: "no live worker")
    try:
        response = httpx.post(f"{front.url}/v1/messages", json=BODY, timeout=30)
    finally:
        front.set_plan(front.echo_plan)
    assert response.status_code == 503
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "overloaded_error"


def test_cached_prompt_tokens_split_the_usage(front: FrontUnderTest) -> None:
    whole = httpx.post(f"{front.url}/v1/messages", json=BODY, timeout=30).json()
    usage = whole["usage"]
    read, created = front.engine.cached_tokens
    prompt = usage["input_tokens"] + read + created
    assert (usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (read, created)
    with httpx.stream("POST", f"{front.url}/v1/messages", json={**BODY, "stream": True}, timeout=30) as response:
        seen = named_sse_events([line for line in response.iter_lines() if line])
    start, end = seen[0], next(event for event in seen if event["type"] == "message_delta")
    assert start["message"]["usage"] == {"input_tokens": prompt, "output_tokens": 0}
    assert end["usage"] == usage and end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
