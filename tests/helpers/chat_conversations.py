"""A battery of chat inputs for the chat-template differential tests (unit/tokenizer/test_chat_template*.py)."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path
from typing import Any

from helpers.fixtures import FIXTURE_TOKENIZER_DIRS

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web <b>fast</b> & well",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}

SYSTEM = {"role": "system", "content": "You are a helpful assistant. 你好 👋"}
USER = {"role": "user", "content": "What's the weather in Zürich? Answer in one line."}
ASSISTANT = {"role": "assistant", "content": "It is sunny, 21 °C."}
TOOL_CALL_TURN = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "celsius"}'},
        }
    ],
}
TOOL_CALL_DICT_ARGS = {
    "role": "assistant",
    "content": "Let me check two cities.",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京"}}},
    ],
}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21, "sky": "sun"}'}
TOOL_RESULT_2 = {"role": "tool", "tool_call_id": "c2", "name": "get_weather", "content": "rain, 14 °C"}
MULTIPART_USER = {
    "role": "user",
    "content": [
        {"type": "text", "text": "Describe this picture: "},
        {"type": "image_url", "image_url": {"url": "http://example.invalid/cat.png"}},
        {"type": "text", "text": "in three words."},
    ],
}
THINKING_ASSISTANT = {"role": "assistant", "content": "The answer is 4.", "reasoning_content": "2+2 is 4.\n"}
INLINE_THINK_ASSISTANT = {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nIt is 4."}
TRICKY_USER = {"role": "user", "content": "{{ 7*7 }} {% raw %} <|im_end|> \\n \"quotes\" 'single' \t tab  "}
DOCUMENTS = [
    {"title": "Zürich climate", "text": "Mild summers; 'sunny' days & <rain>."},
    {"title": "東京", "text": "Humid summers."},
]

# (case id, messages, options for apply_chat_template)
CASES: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = [
    ("user", [USER], {}),
    ("user_gen", [USER], {"add_generation_prompt": True}),
    ("system_user_gen", [SYSTEM, USER], {"add_generation_prompt": True}),
    ("multi_turn", [SYSTEM, USER, ASSISTANT, {"role": "user", "content": "And tomorrow?"}], {}),
    (
        "multi_turn_gen",
        [SYSTEM, USER, ASSISTANT, {"role": "user", "content": "And tomorrow?"}],
        {"add_generation_prompt": True},
    ),
    ("thinking_off", [USER], {"add_generation_prompt": True, "enable_thinking": False}),
    ("thinking_on", [USER], {"add_generation_prompt": True, "enable_thinking": True}),
    ("reasoning_content", [USER, THINKING_ASSISTANT], {}),
    (
        "reasoning_history",
        [USER, THINKING_ASSISTANT, {"role": "user", "content": "Sure?"}],
        {"add_generation_prompt": True},
    ),
    ("inline_think", [USER, INLINE_THINK_ASSISTANT], {}),
    ("tools", [SYSTEM, USER], {"tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True}),
    ("tools_no_system", [USER], {"tools": [WEATHER_TOOL], "add_generation_prompt": True}),
    (
        "tool_round_trip",
        [SYSTEM, USER, TOOL_CALL_TURN, TOOL_RESULT],
        {"tools": [WEATHER_TOOL], "add_generation_prompt": True},
    ),
    (
        "two_tool_results",
        [USER, TOOL_CALL_DICT_ARGS, TOOL_RESULT, TOOL_RESULT_2],
        {"tools": [WEATHER_TOOL], "add_generation_prompt": True},
    ),
    (
        "tool_round_trip_empty_content",
        [SYSTEM, USER, {**TOOL_CALL_TURN, "content": ""}, TOOL_RESULT],
        {"tools": [WEATHER_TOOL], "add_generation_prompt": True},
    ),
    ("tool_then_answer", [USER, TOOL_CALL_TURN, TOOL_RESULT, ASSISTANT], {"tools": [WEATHER_TOOL]}),
    ("multipart", [SYSTEM, MULTIPART_USER], {"add_generation_prompt": True}),
    ("tricky_text", [TRICKY_USER], {"add_generation_prompt": True}),
    ("documents", [USER], {"documents": DOCUMENTS, "add_generation_prompt": True}),
    ("continue_final", [USER, {"role": "assistant", "content": "It is"}], {"continue_final_message": True}),
    (
        "continue_final_trailing_space",
        [USER, {"role": "assistant", "content": "Sunny and "}],
        {"continue_final_message": True},
    ),
    (
        "continue_final_multipart",
        [USER, {"role": "assistant", "content": [{"type": "text", "text": "Well, "}]}],
        {"continue_final_message": True},
    ),
    ("continue_user", [SYSTEM, {"role": "user", "content": "Complete: the sky is"}], {"continue_final_message": True}),
    ("empty_content", [{"role": "user", "content": ""}], {"add_generation_prompt": True}),
    ("unknown_role", [{"role": "narrator", "content": "Once upon a time"}], {}),
    ("reasoning_effort", [USER], {"add_generation_prompt": True, "reasoning_effort": "high"}),
]


def unpack_tokenizer_dir(name: str, destination: Path) -> Path:
    source = FIXTURE_TOKENIZER_DIRS[name]
    target = destination / name
    target.mkdir()
    with lzma.open(source / "tokenizer.json.xz") as compressed:
        (target / "tokenizer.json").write_bytes(compressed.read())
    for extra in source.iterdir():
        if extra.name != "tokenizer.json.xz" and extra.is_file():
            shutil.copy(extra, target / extra.name)
    return target
