"""A Responses request as the chat request it means (openai_responses.decode_responses), and its store."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from detok_worker.front.errors import APIError
from detok_worker.front.openai_responses import ResponseStore, StoredResponse, decode_responses


def decode(kept: ResponseStore | None = None, **fields: Any) -> Any:
    body = msgspec.json.encode({"model": "m", "input": "Hi", **fields})
    return decode_responses(body, kept or ResponseStore(10))[0]


def test_an_assistants_reasoning_text_and_calls_make_one_message() -> None:
    chat = decode(
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Ask."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
            {"type": "function_call_output", "call_id": "call_2", "output": "9 C"},
        ],
        max_output_tokens=7,
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        reasoning={"effort": "low"},
    )
    calls = [
        {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'},
        }
        for n, city in ((1, "Paris"), (2, "Oslo"))
    ]
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "reasoning": "Ask.", "content": "Looking.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "9 C"},
    ]
    assert chat.max_tokens == 7 and chat.reasoning_effort == "low"
    assert chat.response_format == {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}


def test_a_previous_response_brings_its_conversation_without_its_instructions() -> None:
    store = ResponseStore(2)
    earlier = [
        {"role": "system", "content": "Old rules."},
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "B"},
    ]
    store.put("resp-1", StoredResponse(b"{}", earlier))
    chat = decode(store, previous_response_id="resp-1", instructions="New rules.", input="C")
    assert chat.messages == [
        {"role": "system", "content": "New rules."},
        {"role": "user", "content": "A"},
        {"role": "assistant", "content": "B"},
        {"role": "user", "content": "C"},
    ]
    store.put("resp-2", StoredResponse(b"{}", []))
    store.put("resp-3", StoredResponse(b"{}", []))  # past capacity: the oldest goes
    with pytest.raises(APIError) as gone:
        store.get("resp-1")
    assert gone.value.status == 404
    with pytest.raises(APIError) as off:
        decode(ResponseStore(0), store=True)
    assert off.value.param == "store"


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"type": "reasoning", "encrypted_content": "e"}]}, "input[0].encrypted_content"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"max_tool_calls": 2}, "max_tool_calls"),
    ],
)
def test_refused_fields_are_named(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(APIError) as refused:
        decode(**fields)
    assert refused.value.status == 400 and refused.value.param == named
