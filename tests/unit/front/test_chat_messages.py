"""The chat messages a template gets, as vLLM's server prepares them: an assistant message's tool calls with their
arguments as objects (a JSON string decoded; none, or one that is not a JSON object, as {}), an empty tool_calls
list dropped, calls other than functions refused. (Rendered side by side with vLLM's server: test_vllm_flags.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from detok_worker.config import load_config
from detok_worker.front.errors import APIError
from detok_worker.front.prompts import chat_prompt_text, prompt_chars
from detok_worker.front.validation import Limits, decode_chat
from detok_worker.tokenizer.backends.mock import MockTokenizer

# prints each assistant call's arguments as the template sees them: their type, then their JSON
TEMPLATE = (
    "{% for m in messages %}{{ m.role }}"
    "{% if m.tool_calls is defined %}:{% for c in m.tool_calls %}"
    "{{ c.function.name }}={{ 'object' if c.function.arguments is mapping else 'other' }}"
    "{{ c.function.arguments | tojson }};{% endfor %}{% endif %}|{% endfor %}"
)


def rendered(messages: list[dict[str, Any]]) -> str:
    tokenizer = MockTokenizer(chat_template=TEMPLATE)
    limits = Limits.from_config(load_config(None, {}), "m", tokenizer)
    body = decode_chat(json.dumps({"messages": messages, "add_generation_prompt": False}).encode())
    return chat_prompt_text(body, tokenizer, limits)


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": name, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_call_arguments_reach_the_template_as_objects() -> None:
    calls = [
        call("spaced", '{"city":   "Paris",  "n": 2}'),
        call("given", {"k": [1]}),
        call("broken", '{"city": '),
        call("array", "[1, 2]"),
        call("empty", ""),
        call("none", None),
    ]
    text = rendered([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": calls}])
    expected = ";".join(
        f"{name}=object{json.dumps(arguments)}"
        for name, arguments in [
            ("spaced", {"city": "Paris", "n": 2}),
            ("given", {"k": [1]}),
            ("broken", {}),
            ("array", {}),
            ("empty", {}),
            ("none", {}),
        ]
    )
    assert text == f"user|assistant:{expected};|"


def test_an_empty_call_list_is_dropped_and_other_calls_are_refused() -> None:
    assert rendered([{"role": "assistant", "content": "a", "tool_calls": []}]) == "assistant|"
    with pytest.raises(APIError) as refused:
        rendered([{"role": "assistant", "content": "a", "tool_calls": [{"type": "custom", "custom": {}}]}])
    assert refused.value.status == 400 and refused.value.param == "messages"


def test_any_role_reaches_the_template() -> None:
    """vLLM's server passes every role on (Llama 3's templates know "ipython"); a role that is not a string is not."""
    assert rendered([{"role": "ipython", "content": "42"}]) == "ipython|"
    with pytest.raises(APIError) as refused:
        rendered([{"role": 7, "content": "x"}])
    assert refused.value.param == "messages"


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": None},
        {"role": "system", "content": None},
        {"role": "developer", "content": None},
        {"role": "tool", "tool_call_id": "c1", "content": None},
        {"role": "function", "content": None},
        {"role": "ipython", "content": None},
    ],
)
def test_a_null_content_is_refused_where_vllm_refuses_it(message: dict[str, Any]) -> None:
    """vLLM's server validates each message as one of OpenAI's message types or its any-role type (a 400 when none
    takes it): a user, system, developer or tool message, and a function message without a name, need a string or
    a list of parts."""
    with pytest.raises(APIError) as refused:
        rendered([message])
    assert (refused.value.status, refused.value.param) == (400, "messages")
    assert "messages[0].content" in refused.value.message


def test_a_null_or_missing_content_is_taken_where_vllm_takes_it() -> None:
    """The assistant's message and a named function message may have a null content; any message may have none."""
    messages = [
        {"role": "user"},
        {"role": "assistant", "content": None},
        {"role": "function", "name": "f", "content": None},
        {"role": "ipython"},
    ]
    assert rendered(messages) == "user|assistant|function|ipython|"


def test_a_prompts_size_counts_the_messages_text_and_is_unknown_with_tools_documents_or_parts() -> None:
    """What decides whether a prompt is rendered and tokenized on the loop (`prompt_chars`): the messages' string
    contents; a request whose template also renders tools or documents, or whose content is parts, goes to a thread."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert prompt_chars(decode_chat(json.dumps({"messages": messages}).encode())) == len("Be brief.Hi there")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for extra in ({"tools": [tool]}, {"documents": [{"title": "t", "text": "d"}]}):
        assert prompt_chars(decode_chat(json.dumps({"messages": messages, **extra}).encode())) is None, extra
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert prompt_chars(decode_chat(json.dumps({"messages": parts}).encode())) is None
