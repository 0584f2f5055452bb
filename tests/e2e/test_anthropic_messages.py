"""The official `anthropic` client against a real `detok serve`: Anthropic's Messages API runs the chat path, so its
text is the chat answer's text (the same ids, decoded once), stop sequences end it as `stop_sequence`, and a
recorded Qwen3 output with thinking and a tool call comes out as thinking, text and tool_use blocks, streamed and
whole alike; errors come in Anthropic's shape, and its key in x-api-key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.parse_cases import CASES, write_case_trace
from helpers.serve_helpers import ServeProcess, serving, trace_service

anthropic = pytest.importorskip("anthropic")

CASE = CASES[0]  # qwen3-think-tool
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
KEY = "sk-messages-test"


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_case_trace(tmp_path_factory.mktemp("trace") / "qwen3_tool.trace", CASE)


@pytest.fixture(scope="module")
def replayed(trace: Path) -> Iterator[Any]:
    """A service replaying the recorded tool call (parsers on auto: Qwen3's reasoning and hermes tool calls)."""
    with trace_service(trace) as serve:
        yield anthropic.Anthropic(base_url=serve.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def stub() -> Iterator[ServeProcess]:
    """The stub engine echoing each prompt's ids (its output is known: the decode of the rendered prompt's ids),
    with an API key."""
    with serving("--workers", "2", "--source", "echo", env={"DETOK_API_KEY": KEY}) as serve:
        yield serve


@pytest.fixture(scope="module")
def client(stub: ServeProcess) -> Any:
    return anthropic.Anthropic(base_url=stub.url, api_key=KEY, max_retries=0)


def chat_text(stub: ServeProcess, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": model_of(stub), "messages": messages, **fields}
    response = httpx.post(f"{stub.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def model_of(stub: ServeProcess) -> str:
    return httpx.get(f"{stub.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()["data"][0]["id"]


def test_text_is_the_chat_answers_text_whole_and_streamed(stub: ServeProcess, client: Any) -> None:
    model = model_of(stub)
    messages = [{"role": "user", "content": "Tell me about the weather 😀 今日は, and in Paris and Oslo too. " * 3}]
    chat = chat_text(stub, messages, max_tokens=40)
    prompt_ids = httpx.post(
        f"{stub.url}/tokenize", json={"model": model, "messages": messages}, headers={"Authorization": f"Bearer {KEY}"}
    )
    whole = client.messages.create(model=model, max_tokens=40, messages=messages)
    assert [block.type for block in whole.content] == ["text"]
    assert whole.content[0].text == chat["choices"][0]["message"]["content"]
    tokenizer = load_fixture_tokenizer("qwen3")
    assert whole.content[0].text == tokenizer.decode(prompt_ids.json()["tokens"][:40], skip_special_tokens=True)
    assert whole.stop_reason == "max_tokens" and whole.stop_sequence is None
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (chat["usage"]["prompt_tokens"], 40)
    assert whole.role == "assistant" and whole.type == "message" and whole.model == model

    with client.messages.stream(model=model, max_tokens=40, messages=messages) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[1] == "content_block_start" and kinds[-3:-1] == ["content_block_stop", "message_delta"]
    assert final.content[0].text == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == ("max_tokens", 40)


def test_a_stop_sequence_ends_the_message_and_is_named(stub: ServeProcess, client: Any) -> None:
    model = model_of(stub)
    messages = [{"role": "user", "content": "Hello there, the weather in Paris is sunny and warm today."}]
    full = chat_text(stub, messages, max_tokens=60)["choices"][0]["message"]["content"]
    words = full.split()
    stop = words[len(words) // 2]
    whole = client.messages.create(model=model, max_tokens=60, messages=messages, stop_sequences=[stop])
    assert whole.stop_reason == "stop_sequence" and whole.stop_sequence == stop
    assert whole.content[0].text == full[: full.index(stop)]
    with client.messages.stream(model=model, max_tokens=60, messages=messages, stop_sequences=[stop]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)


def test_thinking_text_and_tool_use_blocks_whole(replayed: Any) -> None:
    whole = replayed.messages.create(model="qwen3", max_tokens=200, messages=ASK, tools=TOOLS)
    assert [block.type for block in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.content[0].thinking == CASE.reasoning
    assert whole.content[1].text == CASE.content
    call = whole.content[2]
    assert (call.name, call.input) == (CASE.tool_calls[0][0], json.loads(CASE.tool_calls[0][1]))
    assert call.id.startswith("toolu_")
    assert whole.stop_reason == "tool_use" and whole.stop_sequence is None


def test_thinking_text_and_tool_use_blocks_streamed(replayed: Any) -> None:
    with replayed.messages.stream(model="qwen3", max_tokens=200, messages=ASK, tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [event.content_block.type for event in events if event.type == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    deltas = [event.delta for event in events if event.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == CASE.reasoning
    assert "".join(d.text for d in deltas if d.type == "text_delta") == CASE.content
    arguments = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    assert "".join(arguments) == CASE.tool_calls[0][1] and len(arguments) > 1  # in fragments
    # each block stops before the next starts, at the index it started with
    opened = [(event.type, event.index) for event in events if event.type.startswith("content_block_s")]
    assert opened == [(kind, index) for index in range(3) for kind in ("content_block_start", "content_block_stop")]
    assert [block.type for block in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == json.loads(CASE.tool_calls[0][1])
    assert final.stop_reason == "tool_use"


def test_count_tokens_is_the_rendered_prompts_length(stub: ServeProcess, client: Any) -> None:
    model = model_of(stub)
    conversation = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C, sunny"}]},
    ]
    counted = client.messages.count_tokens(model=model, system="Be brief.", messages=conversation, tools=TOOLS)
    answered = client.messages.create(model=model, max_tokens=1, system="Be brief.", messages=conversation, tools=TOOLS)
    # the same conversation in OpenAI's shape, as /tokenize renders it
    openai_messages = [
        {"role": "system", "content": "Be brief."},
        conversation[0],
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C, sunny"},
    ]
    tools = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
        }
        for t in TOOLS
    ]
    tokenized = httpx.post(
        f"{stub.url}/tokenize",
        json={"model": model, "messages": openai_messages, "tools": tools},
        headers={"Authorization": f"Bearer {KEY}"},
    ).json()
    assert counted.input_tokens == answered.usage.input_tokens == tokenized["count"]


def test_errors_in_anthropics_shape(stub: ServeProcess, client: Any) -> None:
    model = model_of(stub)
    url = f"{stub.url}/v1/messages"
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    good = httpx.post(url, json=body, headers={"x-api-key": KEY})
    assert good.status_code == 200 and good.json()["type"] == "message"
    for headers, status, kind in (
        ({"x-api-key": "wrong"}, 401, "authentication_error"),
        ({}, 401, "authentication_error"),
        ({"Authorization": f"Bearer {KEY}"}, 200, None),
    ):
        response = httpx.post(url, json=body, headers=headers)
        assert response.status_code == status, response.text
        if kind is not None:
            assert response.json() == {
                "type": "error",
                "error": {"type": kind, "message": response.json()["error"]["message"]},
            }
    refusals = {
        "unknown field": ({**body, "container": "c1"}, "container"),
        "no max_tokens": ({k: v for k, v in body.items() if k != "max_tokens"}, "max_tokens"),
        "an image": (
            {
                **body,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
            },
            "messages[0].content[0].type",
        ),
        "a built-in tool": ({**body, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
        "an unknown model": ({**body, "model": "no-such-model"}, "model"),
    }
    for case, (refused, named) in refusals.items():
        response = httpx.post(url, json=refused, headers={"x-api-key": KEY})
        assert response.status_code in (400, 404), (case, response.text)
        error = response.json()
        assert error["type"] == "error", case
        assert error["error"]["type"] in ("invalid_request_error", "not_found_error"), case
        assert named in error["error"]["message"], (case, error)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}], extra_body={"temperature": -1}
        )
