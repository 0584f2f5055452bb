"""The official `openai` client against a real `detok serve` (embedded Qwen3 tokenizer, parsers on auto) whose
engine stub replays a recorded Qwen3 output with thinking and a tool call: reasoning_content, content and
tool_calls come out split, streamed and whole alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from helpers.parse_cases import CASES, write_case_trace
from helpers.serve_helpers import trace_service

CASE = CASES[0]  # qwen3-think-tool
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_case_trace(tmp_path_factory.mktemp("trace") / "qwen3_tool.trace", CASE)


@pytest.fixture(scope="module")
def client(trace: Path) -> Iterator[openai.OpenAI]:
    with trace_service(trace) as serve:
        yield openai.OpenAI(base_url=f"{serve.url}/v1", api_key="none")


def test_the_reasoning_goes_in_the_field_asked_or_nowhere(trace: Path) -> None:
    """front.reasoning_field = reasoning (vLLM 0.32's name, the default on --source vllm); include_reasoning false
    (vLLM's request field) leaves the reasoning out."""
    with (
        trace_service(trace, "--set", "front.reasoning_field=reasoning") as serve,
        httpx.Client(base_url=serve.url, timeout=60) as http,
    ):
        body = {"messages": MESSAGES, "tools": TOOLS}
        message = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        left_out = http.post("/v1/chat/completions", json={**body, "include_reasoning": False}).json()
    assert message["reasoning"] == CASE.reasoning and "reasoning_content" not in message
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert "".join(delta.get("reasoning", "") for delta in deltas) == CASE.reasoning
    assert not any("reasoning_content" in delta for delta in deltas)
    shown = left_out["choices"][0]["message"]
    assert shown["content"] == CASE.content and "reasoning" not in shown and "reasoning_content" not in shown


def test_whole_response_is_split(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    response = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS)
    choice = response.choices[0]
    message = choice.message
    assert message.reasoning_content == CASE.reasoning  # type: ignore[attr-defined]
    assert message.content == CASE.content
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert (call.type, call.function.name, call.function.arguments) == ("function", *CASE.tool_calls[0])
    assert call.id.startswith("chatcmpl-tool-")
    assert choice.finish_reason == "tool_calls"


def test_streamed_pieces_concatenate_to_the_whole(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    reasoning, content, names, arguments, finishes = [], [], [], [], []
    for chunk in client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, stream=True):
        delta = chunk.choices[0].delta
        reasoning.append(getattr(delta, "reasoning_content", None) or "")
        content.append(delta.content or "")
        for call in delta.tool_calls or []:
            assert call.index == 0
            if call.function.name:
                names.append((call.id, call.function.name))
            arguments.append(call.function.arguments or "")
        finishes.append(chunk.choices[0].finish_reason)
    assert "".join(reasoning) == CASE.reasoning
    assert "".join(content) == CASE.content
    assert [name for _, name in names] == ["get_weather"] and names[0][0].startswith("chatcmpl-tool-")
    assert "".join(arguments) == CASE.tool_calls[0][1]
    assert len([piece for piece in arguments if piece]) > 1  # the arguments arrive in fragments
    assert finishes[-1] == "tool_calls"


def test_tool_choice_none_leaves_the_markup_in_content(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    response = client.chat.completions.create(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="none")
    message = response.choices[0].message
    assert message.reasoning_content == CASE.reasoning  # type: ignore[attr-defined]
    assert message.content == CASE.content + CASE.output.split("</think>\n\n", 1)[1]
    assert not message.tool_calls
    assert response.choices[0].finish_reason == "stop"
