"""The official `openai` client's Responses API against a real `detok serve`: it runs the chat path, so on the echo
stub (whose output is the rendered prompt's own ids) the text is the decode of the prompt's ids, and a follow-up's
prompt holds the previous turn; a recorded Qwen3 output with thinking and a tool call comes out as reasoning,
message and function_call items, streamed and whole alike; stored responses are served by id."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.parse_cases import CASES, write_case_trace
from helpers.serve_helpers import ServeProcess, serving, trace_service

CASE = CASES[0]  # qwen3-think-tool
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@pytest.fixture(scope="module")
def echo() -> Iterator[ServeProcess]:
    with serving("--workers", "2", "--source", "echo") as serve:
        yield serve


@pytest.fixture(scope="module")
def client(echo: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{echo.url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    trace = write_case_trace(tmp_path_factory.mktemp("trace") / "qwen3_tool.trace", CASE)
    with trace_service(trace) as serve:
        yield openai.OpenAI(base_url=f"{serve.url}/v1", api_key="none", max_retries=0)


def prompt_ids(echo: ServeProcess, messages: list[dict[str, Any]]) -> list[int]:
    return httpx.post(f"{echo.url}/tokenize", json={"messages": messages}).json()["tokens"]


def test_text_is_the_decode_of_the_ids_whole_and_streamed(echo: ServeProcess, client: openai.OpenAI) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    text = "Tell me about the weather 😀 今日は, and in Paris and Oslo too. " * 3
    ids = prompt_ids(echo, [{"role": "user", "content": text}])
    whole = client.responses.create(model="qwen3", input=text, max_output_tokens=40)
    assert whole.output_text == tokenizer.decode(ids[:40], skip_special_tokens=True)
    assert [item.type for item in whole.output] == ["message"]
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (len(ids), 40)
    assert whole.object == "response" and whole.max_output_tokens == 40

    with client.responses.stream(model="qwen3", input=text, max_output_tokens=40) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == "incomplete"
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}

    whole_all = client.responses.create(model="qwen3", input="Hi", max_output_tokens=1000)
    assert whole_all.status == "completed" and whole_all.incomplete_details is None  # the echo ended on its own


def test_a_follow_up_carries_the_conversation_and_stored_responses_are_served(
    echo: ServeProcess, client: openai.OpenAI
) -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    first = client.responses.create(model="qwen3", input="Name a city.", instructions="Be brief.", max_output_tokens=8)
    second = client.responses.create(
        model="qwen3", input=[{"role": "user", "content": "And another?"}], previous_response_id=first.id
    )
    # the follow-up's prompt: the first turn and its answer, without the first's instructions (they do not carry
    # over); the echo's output is that prompt, up to its first end of turn
    conversation = [
        {"role": "user", "content": "Name a city."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And another?"},
    ]
    ids = prompt_ids(echo, conversation)
    assert second.usage.input_tokens == len(ids)
    assert second.output_text == tokenizer.decode(ids, skip_special_tokens=True).split("\n")[0] + "\nName a city."
    system = [{"role": "system", "content": "Be brief."}, conversation[0]]
    assert first.usage.input_tokens == len(prompt_ids(echo, system)) and first.instructions == "Be brief."
    assert second.previous_response_id == first.id
    kept = client.responses.retrieve(first.id)
    assert (kept.id, kept.output_text, kept.status) == (first.id, first.output_text, first.status)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp-nothing-like-it")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="qwen3", input="x", previous_response_id="resp-nothing-like-it")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(first.id)
    unstored = client.responses.create(model="qwen3", input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_reasoning_message_and_function_call_items(replayed: openai.OpenAI) -> None:
    whole = replayed.responses.create(model="qwen3", input="What is the weather in Paris?", tools=TOOLS)
    assert [item.type for item in whole.output] == ["reasoning", "message", "function_call"]
    assert whole.output[0].content[0].text == CASE.reasoning
    assert whole.output[1].content[0].text == CASE.content
    call = whole.output[2]
    assert (call.name, call.arguments) == CASE.tool_calls[0] and call.call_id.startswith("call_")
    assert whole.status == "completed"

    with replayed.responses.stream(model="qwen3", input="What is the weather in Paris?", tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = [event.item.type for event in events if event.type == "response.output_item.added"]
    assert added == ["reasoning", "message", "function_call"]
    reasoning = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    arguments = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
    assert reasoning == CASE.reasoning and "".join(arguments) == CASE.tool_calls[0][1] and len(arguments) > 1
    # each item is done before the next is added, at the output index it was added with
    order = [(event.type, event.output_index) for event in events if event.type.startswith("response.output_item.")]
    assert order == [
        (kind, index) for index in range(3) for kind in ("response.output_item.added", "response.output_item.done")
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert json.loads(final.output[2].arguments) == json.loads(CASE.tool_calls[0][1])

    # the call's output sent back as an input item (the recorded output comes again: the trace replays it)
    follow_up = replayed.responses.create(
        model="qwen3",
        tools=TOOLS,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"},
        ],
    )
    assert follow_up.status == "completed" and follow_up.usage.input_tokens > whole.usage.input_tokens


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        (
            {"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"reasoning": {"summary": "auto"}}, "reasoning"),
        ({"truncation": "auto"}, "truncation"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_what_detok_cannot_do_is_refused_by_name(echo: ServeProcess, fields: dict[str, Any], named: str) -> None:
    response = httpx.post(f"{echo.url}/v1/responses", json={"model": "qwen3", "input": "Hi", **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == named or named in error["message"], error
