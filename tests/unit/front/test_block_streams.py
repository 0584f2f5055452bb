"""Anthropic's Messages and OpenAI's Responses streams of plain text (no parser: its answer is all text) on the
front against a played engine: their own named events, never a chat chunk, with the whole answer's text in one
block, and (Responses) every event numbered in order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.front_harness import FrontUnderTest, running_front
from helpers.serve_helpers import named_sse_events, wait_for

ASK = "Hello there, how are you?"


@pytest.fixture(scope="module")
def front(qwen3: Any) -> Iterator[FrontUnderTest]:
    with running_front(qwen3, **{"front.reasoning_parser": "none"}) as f:
        yield f


def streamed(front: FrontUnderTest, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{front.url}{path}", json={**body, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        return named_sse_events([line for line in response.iter_lines() if line])


def test_a_messages_stream_of_text_is_one_text_block(front: FrontUnderTest) -> None:
    body = {"model": "qwen3", "max_tokens": 64, "messages": [{"role": "user", "content": ASK}]}
    whole = httpx.post(f"{front.url}/v1/messages", json=body, timeout=30).json()
    events = streamed(front, "/v1/messages", body)
    kinds = [event["type"] for event in events]
    deltas = [event for event in events if event["type"] == "content_block_delta"]
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * len(deltas)] + [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert len(deltas) > 1 and events[1]["content_block"] == {"type": "text", "text": ""}
    assert all(delta["index"] == 0 and delta["delta"]["type"] == "text_delta" for delta in deltas)
    assert "".join(delta["delta"]["text"] for delta in deltas) == whole["content"][0]["text"]
    assert events[-2]["usage"] == whole["usage"]
    assert whole["id"].startswith("msg_") and events[0]["message"]["id"].startswith("msg_")  # Anthropic's prefix


def test_a_responses_stream_of_text_is_one_message_numbered_in_order(front: FrontUnderTest) -> None:
    body = {"model": "qwen3", "input": ASK, "max_output_tokens": 64}
    whole = httpx.post(f"{front.url}/v1/responses", json=body, timeout=30).json()
    events = streamed(front, "/v1/responses", body)
    kinds = [event["type"] for event in events]
    deltas = [event for event in events if event["type"] == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    text = whole["output"][0]["content"][0]["text"]
    assert len(deltas) > 1 and "".join(delta["delta"] for delta in deltas) == text
    item_id = events[2]["item"]["id"]
    assert all(delta["item_id"] == item_id and delta["output_index"] == 0 for delta in deltas)
    assert events[-4]["text"] == text and events[-1]["response"]["output"][0]["content"][0]["text"] == text
    assert whole["id"].startswith("resp_") and events[-1]["response"]["id"].startswith("resp_")  # OpenAI's, vLLM's


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"max_output_tokens": 10**9}, "max_output_tokens"), ({"input": []}, "input")],
)
def test_a_responses_refusal_names_the_responses_field(
    front: FrontUnderTest, fields: dict[str, Any], named: str
) -> None:
    """The chat request's checks refuse what a Responses request asked: the refusal names the Responses field (as
    vLLM's server does), not the chat field it became."""
    refused = httpx.post(f"{front.url}/v1/responses", json={"input": "Hi", **fields}, timeout=30)
    error = refused.json()["error"]
    assert (refused.status_code, error["param"]) == (400, named)
    assert named in error["message"]


# vLLM 0.32's ResponsesResponse fields (JSON objects have no order: compared as sets)
VLLM_RESPONSE_FIELDS = [
    "id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object", "output",
    "parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p", "background", "max_output_tokens",
    "max_tool_calls", "previous_response_id", "prompt", "reasoning", "service_tier", "status", "text",
    "top_logprobs", "truncation", "usage", "user", "presence_penalty", "frequency_penalty", "kv_transfer_params",
    "ec_transfer_params", "input_messages", "output_messages",
]  # fmt: skip


def test_a_responses_object_on_the_vllm_source_is_vllms(qwen3: Any) -> None:
    """vLLM's server (ResponsesResponse.from_request) echoes its sampling parameters: a greedy temperature's top_p of
    1, "none" for a tool_choice without tools, the service tier, the penalties, max_output_tokens the rest of the
    context when the request sets none; no metadata, reasoning or text when the request gives none, no store; a
    finished message's text part has null logprobs. The same object whole and in the stream's created/completed."""
    options = {"engine.source": "vllm", "engine.model": "m", "front.max_model_len": 4096}
    plain = {"input": ASK, "temperature": 0, "top_p": 0.5, "presence_penalty": 0.5}
    asked = {"input": ASK, "temperature": 0.7, "max_output_tokens": 64, "metadata": {"a": "b"}}
    with running_front(qwen3, **options) as front:
        whole = httpx.post(f"{front.url}/v1/responses", json=plain, timeout=30).json()
        other = httpx.post(f"{front.url}/v1/responses", json=asked, timeout=30).json()
        events = streamed(front, "/v1/responses", plain)
        prompt_tokens = whole["usage"]["input_tokens"]
    created, completed = events[0]["response"], events[-1]["response"]
    for response in (whole, created, completed):
        assert sorted(response) == sorted(VLLM_RESPONSE_FIELDS)
        assert {name: response[name] for name in ("tool_choice", "top_p", "service_tier", "max_output_tokens")} == {
            "tool_choice": "none",
            "top_p": 1.0,
            "service_tier": "auto",
            "max_output_tokens": 4096 - prompt_tokens,
        }
        assert (response["temperature"], response["presence_penalty"], response["frequency_penalty"]) == (0, 0.5, 0.0)
        assert (response["metadata"], response["reasoning"], response["text"], response["top_logprobs"]) == (None,) * 4
    assert whole["output"][0]["content"][0]["logprobs"] is None
    assert completed["output"][0]["content"][0]["logprobs"] is None
    added = next(event["item"] for event in events if event.get("type") == "response.output_item.added")
    for message in (whole["output"][0], completed["output"][0], added):
        assert message["type"] == "message" and "phase" in message and message["phase"] is None
    assert (other["top_p"], other["max_output_tokens"], other["metadata"]) == (1.0, 64, {"a": "b"})


def test_a_responses_object_on_the_vllm_source_echoes_the_models_sampling_defaults(qwen3: Any) -> None:
    """A sampling field the request leaves out is the model's default (its generation config's, which the engine
    reports in its stats), else vLLM's own; a field the request sets wins; a greedy default temperature makes top_p
    1; max_output_tokens is the model's default when the request sets none."""
    options = {"engine.source": "vllm", "engine.model": "m", "front.max_model_len": 4096}
    with running_front(qwen3, **options) as front:

        def answer(**fields: Any) -> dict[str, Any]:
            return httpx.post(f"{front.url}/v1/responses", json={"input": ASK, **fields}, timeout=30).json()

        bare = answer()
        defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 100, "presence_penalty": 1.5}
        front.engine.sampling_defaults = defaults
        defaulted = wait_for(lambda: (made := answer())["temperature"] == 0.6 and made, 5, what="the defaults")
        asked = answer(temperature=0.2, top_p=0.5, max_output_tokens=300, frequency_penalty=0.1)
        front.engine.sampling_defaults = {"temperature": 0, "top_p": 0.95}
        greedy = wait_for(lambda: (made := answer())["temperature"] == 0 and made, 5, what="a greedy default")
    fields = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "max_output_tokens")
    shown = [tuple(response[name] for name in fields) for response in (bare, defaulted, asked, greedy)]
    assert shown == [
        (1.0, 1.0, 0.0, 0.0, 4096 - bare["usage"]["input_tokens"]),
        (0.6, 0.95, 1.5, 0.0, 100),
        (0.2, 0.5, 1.5, 0.1, 300),
        (0, 1.0, 0.0, 0.0, 4096 - greedy["usage"]["input_tokens"]),
    ]
