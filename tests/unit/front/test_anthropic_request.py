"""A Messages request as the chat request it means (anthropic_api.decode_messages), and its stop reasons."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from detok_worker.front.anthropic_api import decode_count_tokens, decode_messages, stop_reason
from detok_worker.front.errors import APIError


def decode(**fields: Any) -> Any:
    body = {"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "Hi"}], **fields}
    return decode_messages(msgspec.json.encode(body))


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages() -> None:
    chat = decode(
        system=[{"type": "text", "text": "x-anthropic-billing-header: cc=1;"}, {"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Call the tool.", "signature": "s"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
                    {"type": "text", "text": "And Oslo?"},
                ],
            },
        ],
    )
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},  # the per-request attribution line dropped
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning": "Call the tool.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},  # the results first, then the user's words
        {"role": "user", "content": "And Oslo?"},
    ]
    assert json.loads(chat.messages[2]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize(
    ("choice", "tool_choice", "parallel"),
    [
        (None, "auto", None),
        ({"type": "auto"}, "auto", None),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, None),
        ({"type": "none"}, "none", None),
    ],
)
def test_tools_and_tool_choice(choice: Any, tool_choice: Any, parallel: bool | None) -> None:
    tools = [{"name": "get_weather", "input_schema": {"properties": {"city": {"type": "string"}}}}]
    chat = decode(tools=tools, **({"tool_choice": choice} if choice else {}))
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": None,
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert chat.tool_choice == tool_choice and chat.parallel_tool_calls == parallel


def test_sampling_stop_stream_and_thinking() -> None:
    chat = decode(
        stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=4, stream=True,
        thinking={"type": "enabled", "budget_tokens": 1024}, metadata={"user_id": "u1"},
    )  # fmt: skip
    assert (chat.max_tokens, chat.stop, chat.temperature, chat.top_p, chat.top_k) == (2048, ["END"], 0.5, 0.9, 4)
    assert chat.stream is True and chat.stream_options is not None and chat.stream_options.include_usage is True
    assert chat.chat_template_kwargs == {"enable_thinking": True} and chat.thinking_token_budget == 1024
    assert chat.user == "u1"
    off = decode(thinking={"type": "disabled"}, chat_template_kwargs={"x": 1})
    assert off.chat_template_kwargs == {"x": 1, "enable_thinking": False} and off.thinking_token_budget is None
    counted = decode_count_tokens(msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "a"}]}))
    assert counted.messages == [{"role": "user", "content": "a"}] and counted.max_tokens is None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"container": "c"}, "container"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking"),  # not under max_tokens
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0]"),
        ({"messages": [{"role": "assistant", "content": [{"type": "tool_result"}]}]}, "messages[0]"),
        ({"tools": [{"name": "b", "type": "bash_20250124", "input_schema": {}}]}, "tools[0].type"),
    ],
)
def test_refused_fields_are_named(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(APIError) as refused:
        decode(**fields)
    assert refused.value.status == 400
    assert (refused.value.param or "").startswith(named) or named in refused.value.message


@pytest.mark.parametrize(
    ("finish", "matched", "calls", "expected"),
    [
        ("length", None, [], ("max_tokens", None)),
        ("stop", None, [], ("end_turn", None)),
        ("stop", 151645, [], ("end_turn", None)),  # a stop token id is the model's own end
        ("stop", "END", [], ("stop_sequence", "END")),
        ("tool_calls", None, ['{"a": 1}'], ("tool_use", None)),
        ("stop", "END", ['{"a": 1}'], ("tool_use", None)),  # the calls are whole: they run
        ("stop", "END", ['{"a": '], ("stop_sequence", "END")),  # the stop cut the call short
        ("abort", None, [], (None, None)),
    ],
)
def test_stop_reasons(finish: str, matched: Any, calls: list[str], expected: tuple[Any, Any]) -> None:
    assert stop_reason(finish, matched, calls) == expected
