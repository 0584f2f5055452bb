"""Every request field of OpenAI's chat and completions schemas (read from the installed `openai` package's
TypedDicts, so a field OpenAI adds fails here until it is handled) and of vLLM's extensions is either used or
refused with a 400 that names it; none is accepted and dropped.

"Used" is one of: forwarded to the engine (the Submit the played engine receives shows the value), applied to
the prompt (the chat template or the encoder received it, or the prompt ids show it), visible in the response
(stream, request_id, ...), or explicitly informational (OpenAI defines them to have no effect on the output).
Each case sends the baseline body plus the field and checks that outcome concretely.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.front_harness import FrontUnderTest, running_front

from detok_worker.bus.messages import Constraint, DetokParams, RequestParams, Submit
from detok_worker.config import load_config
from detok_worker.front.errors import APIError
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest
from detok_worker.front.validation import Limits, check_generation, decode_completion
from detok_worker.tokenizer.backends.mock import MockTokenizer

openai = pytest.importorskip("openai")
from openai.types import completion_create_params  # noqa: E402
from openai.types.chat import completion_create_params as chat_create_params  # noqa: E402


def typed_dict_fields(module: Any) -> set[str]:
    fields: set[str] = set()
    for variant in (module.CompletionCreateParamsStreaming, module.CompletionCreateParamsNonStreaming):
        fields |= variant.__required_keys__ | variant.__optional_keys__
    return fields


OPENAI_CHAT_FIELDS = typed_dict_fields(chat_create_params)
OPENAI_COMPLETION_FIELDS = typed_dict_fields(completion_create_params)
# vLLM's extra request fields (vllm/entrypoints/openai/protocol.py), both endpoints / chat only / completions only
VLLM_FIELDS = {
    "top_k", "min_p", "repetition_penalty", "length_penalty", "use_beam_search", "best_of", "stop_token_ids",
    "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "truncate_prompt_tokens", "truncation_side", "prompt_logprobs", "allowed_token_ids", "bad_words",
    "add_special_tokens", "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "structural_tag",
    "guided_decoding_backend", "guided_whitespace_pattern", "structured_outputs", "priority", "request_id",
    "logits_processors", "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "kv_transfer_params",
    "vllm_xargs", "echo", "session_id", "thinking_token_budget", "stream_interval",
}  # fmt: skip
VLLM_CHAT_FIELDS = {
    "add_generation_prompt", "continue_final_message", "documents", "chat_template", "chat_template_kwargs",
    "mm_processor_kwargs", "include_reasoning", "return_prompt_text",
}  # fmt: skip
VLLM_COMPLETION_FIELDS = {"prompt_embeds", "logprob_token_ids"}

TEMPLATE_PARAMETERS = {
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


class RecordingTokenizer:
    """The fixture tokenizer, remembering what the front asked of it last (template kwargs, encode flags)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.template_messages: list[dict[str, Any]] = []
        self.template_kwargs: dict[str, Any] = {}
        self.add_special_tokens: bool | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        self.template_messages, self.template_kwargs = messages, kwargs
        return self.inner.apply_chat_template(messages, **kwargs)

    def encode(self, text: str, add_special_tokens: bool = False) -> Any:
        self.add_special_tokens = add_special_tokens
        return self.inner.encode(text, add_special_tokens)

    def encode_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.add_special_tokens = add_special_tokens
        return self.inner.encode_ids(text, add_special_tokens)


# ---- what a case expects ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """Forwarded: the engine's RequestParams show the value."""

    check: Callable[[RequestParams], bool]


@dataclass(frozen=True)
class Prompt:
    """Applied to the prompt: the tokenizer saw it, or the Submit's prompt ids show it."""

    check: Callable[[RecordingTokenizer, Submit], bool]


@dataclass(frozen=True)
class Response:
    """Visible in the HTTP response."""

    check: Callable[[httpx.Response], bool]


@dataclass(frozen=True)
class VllmEngine:
    """vLLM's engine-core fields: forwarded (the check holds on the engine's RequestParams) by a front whose engine
    source is vLLM's engine core; refused elsewhere with a 400 naming the field and the source that honours it."""

    check: Callable[[RequestParams], bool]


class Refused:
    """A 400 whose error names the field."""


class Informational:
    """No effect on the output by OpenAI's own definition; accepted (200)."""


Expect = Engine | VllmEngine | Prompt | Response | Refused | Informational
REFUSED = Refused()
INFORMATIONAL = Informational()


def sampling(name: str, value: Any) -> Engine:
    return Engine(lambda params: getattr(params.sampling, name) == value)


def constraint(expected: Constraint) -> Engine:
    return Engine(lambda params: params.sampling.constraint == expected)


def template_kwarg(name: str, value: Any) -> Prompt:
    return Prompt(lambda tokenizer, submit: tokenizer.template_kwargs.get(name) == value)


def token_ids_returned(response: httpx.Response) -> bool:
    """return_token_ids as vLLM answers it: the prompt's ids on the response (chat) or the choice (completions),
    each choice's output ids on the choice; the played engine's output is the prompt's own ids."""
    body = response.json()
    choice = body["choices"][0]
    chat = body["object"] == "chat.completion"
    prompt = body["prompt_token_ids"] if chat else choice["prompt_token_ids"]
    placed = ("prompt_token_ids" in choice) != chat
    return response.status_code == 200 and placed and len(prompt) >= 2 and choice["token_ids"] == prompt


def sse(response: httpx.Response) -> list[dict[str, Any]]:
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(event) for event in events[:-1]]


SCHEMA_TEXT = json.dumps(SCHEMA, separators=(",", ":"))
REQUIRED_TOOL_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "items": {
        "type": "object",
        "anyOf": [
            {
                "properties": {
                    "name": {"type": "string", "enum": ["get_weather"]},
                    "parameters": TOOLS[0]["function"]["parameters"],
                },
                "required": ["name", "parameters"],
            }
        ],
    },
}

# field -> (what to add to the baseline body, what must happen)
SHARED_CASES: dict[str, tuple[dict[str, Any], Expect]] = {
    "model": ({"model": "qwen3"}, Response(lambda r: r.status_code == 200 and r.json()["model"] == "qwen3")),
    "max_tokens": ({"max_tokens": 5}, Engine(lambda p: p.max_tokens == 5)),
    "stream": ({"stream": True}, Response(lambda r: r.headers["content-type"].startswith("text/event-stream"))),
    "stream_options": (
        {"stream": True, "stream_options": {"include_usage": True}},
        Response(lambda r: sse(r)[-1]["usage"]["prompt_tokens"] > 0),
    ),
    "stop": ({"stop": ["END", "\n\n"]}, Engine(lambda p: p.detok.stop == ["END", "\n\n"])),
    "n": ({"n": 2}, Response(lambda r: [choice["index"] for choice in r.json()["choices"]] == [0, 1])),
    "user": ({"user": "user-42"}, INFORMATIONAL),
    "temperature": ({"temperature": 0.3}, sampling("temperature", 0.3)),
    "top_p": ({"top_p": 0.9}, sampling("top_p", 0.9)),
    "presence_penalty": ({"presence_penalty": -0.5}, sampling("presence_penalty", -0.5)),
    "frequency_penalty": ({"frequency_penalty": 0.5}, sampling("frequency_penalty", 0.5)),
    "seed": ({"seed": 1234}, sampling("seed", 1234)),
    # a bias outside -100..100 clamped into it, as vLLM's SamplingParams
    "logit_bias": (
        {"logit_bias": {"13": 5, "7": -100, "9": 101}},
        sampling("logit_bias", {13: 5.0, 7: -100.0, 9: 100.0}),
    ),
    "response_format": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
        constraint(Constraint("json_schema", SCHEMA_TEXT)),
    ),
    "top_k": ({"top_k": 20}, sampling("top_k", 20)),
    "min_p": ({"min_p": 0.05}, sampling("min_p", 0.05)),
    "repetition_penalty": ({"repetition_penalty": 1.1}, sampling("repetition_penalty", 1.1)),
    "guided_json": ({"guided_json": SCHEMA}, constraint(Constraint("json_schema", SCHEMA_TEXT))),
    "guided_regex": ({"guided_regex": "[a-z]+"}, constraint(Constraint("regex", "[a-z]+"))),
    "guided_choice": ({"guided_choice": ["yes", "no"]}, constraint(Constraint("choice", choices=["yes", "no"]))),
    "guided_grammar": ({"guided_grammar": 'root ::= "a"'}, constraint(Constraint("grammar", 'root ::= "a"'))),
    "structural_tag": ({"structural_tag": '{"type": "x"}'}, constraint(Constraint("structural_tag", '{"type":"x"}'))),
    "structured_outputs": ({"structured_outputs": {"regex": "\\d+"}}, constraint(Constraint("regex", "\\d+"))),
    "stop_token_ids": ({"stop_token_ids": [13]}, Engine(lambda p: p.detok.stop_token_ids == [13])),
    "skip_special_tokens": ({"skip_special_tokens": False}, Engine(lambda p: p.detok.skip_special_tokens is False)),
    "include_stop_str_in_output": (
        {"include_stop_str_in_output": True},
        Engine(lambda p: p.detok.include_stop_str_in_output is True),
    ),
    "min_tokens": ({"min_tokens": 2}, Engine(lambda p: p.detok.min_tokens == 2)),
    "ignore_eos": ({"ignore_eos": True}, Engine(lambda p: p.ignore_eos is True)),
    "add_special_tokens": ({"add_special_tokens": True}, Prompt(lambda t, s: t.add_special_tokens is True)),
    "spaces_between_special_tokens": (
        {"spaces_between_special_tokens": False, "skip_special_tokens": False},
        Engine(lambda p: p.detok.spaces_between_special_tokens is False and p.detok.skip_special_tokens is False),
    ),
    "truncate_prompt_tokens": ({"truncate_prompt_tokens": 2}, Prompt(lambda t, s: len(s.prompt_ids) == 2)),
    "truncation_side": (
        {"truncate_prompt_tokens": 1, "truncation_side": "right"},
        # the prompt's first id: "Hello" (completions) or the chat template's <|im_start|>
        Prompt(lambda t, s: s.prompt_ids in ([9707], [151644])),
    ),
    "request_id": ({"request_id": "my id/1"}, Response(lambda r: "-my_id_1-" in r.json()["id"])),
    "best_of": ({"best_of": 2}, REFUSED),
    "use_beam_search": ({"use_beam_search": True}, REFUSED),
    "length_penalty": ({"length_penalty": 0.5}, REFUSED),
    "prompt_logprobs": ({"prompt_logprobs": 1}, VllmEngine(lambda p: p.sampling.prompt_logprobs == 1)),
    "allowed_token_ids": (
        {"allowed_token_ids": [1, 2, 151643]},
        VllmEngine(lambda p: p.sampling.allowed_token_ids == [1, 2, 151643]),
    ),
    "bad_words": ({"bad_words": ["x", " y", "x"]}, VllmEngine(lambda p: p.sampling.bad_words == ["x", " y"])),
    "guided_decoding_backend": ({"guided_decoding_backend": "xgrammar"}, REFUSED),
    "guided_whitespace_pattern": ({"guided_whitespace_pattern": " "}, REFUSED),
    "logits_processors": ({"logits_processors": ["x"]}, REFUSED),
    # the logprob tokens' strings (tests/e2e/test_logprobs.py); a non-boolean is a 400 (below)
    "return_tokens_as_token_ids": ({"return_tokens_as_token_ids": True}, Response(lambda r: r.status_code == 200)),
    "return_token_ids": ({"return_token_ids": True}, Response(token_ids_returned)),
    "priority": ({"priority": -5}, VllmEngine(lambda p: p.priority == -5)),
    "cache_salt": ({"cache_salt": "tenant-7"}, VllmEngine(lambda p: p.cache_salt == "tenant-7")),
    "session_id": ({"session_id": "conv-7"}, VllmEngine(lambda p: p.session_id == "conv-7")),
    "thinking_token_budget": (
        {"thinking_token_budget": 64},
        VllmEngine(lambda p: p.sampling.thinking_token_budget == 64),
    ),
    "kv_transfer_params": ({"kv_transfer_params": {}}, REFUSED),
    "stream_interval": ({"stream_interval": 5}, VllmEngine(lambda p: p.sampling.stream_interval == 5)),
    "vllm_xargs": (
        {"vllm_xargs": {"a": 1, "b": ["x", 2.5]}},
        VllmEngine(lambda p: p.sampling.extra_args == {"a": 1, "b": ["x", 2.5]}),
    ),
}
CHAT_CASES: dict[str, tuple[dict[str, Any], Expect]] = {
    **SHARED_CASES,
    "messages": (
        {"messages": [{"role": "user", "content": "Other words"}]},
        Prompt(lambda t, s: t.template_messages[-1]["content"] == "Other words"),
    ),
    "max_completion_tokens": ({"max_completion_tokens": 6}, Engine(lambda p: p.max_tokens == 6)),
    # the template sees vLLM's shape of a tool (its request model dumped): description null when not given
    "tools": (
        {"tools": [{**TOOLS[0], "function": {**TOOLS[0]["function"], "extra": 1}}]},
        template_kwarg(
            "tools",
            [{"type": "function", "function": {"name": "get_weather", "description": None, **TEMPLATE_PARAMETERS}}],
        ),
    ),
    "tool_choice": (
        {"tools": TOOLS, "tool_choice": "required"},
        constraint(Constraint("json_schema", json.dumps(REQUIRED_TOOL_SCHEMA, separators=(",", ":")))),
    ),
    # vLLM's schema for one call at most (the answer keeps the first call: tests/unit/front/test_forced_tool_calls.py)
    "parallel_tool_calls": (
        {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        constraint(
            Constraint("json_schema", json.dumps({**REQUIRED_TOOL_SCHEMA, "maxItems": 1}, separators=(",", ":")))
        ),
    ),
    "documents": (
        {"documents": [{"title": "t", "text": "d"}]},
        template_kwarg("documents", [{"title": "t", "text": "d"}]),
    ),
    "chat_template_kwargs": (
        {"chat_template_kwargs": {"enable_thinking": False}},
        template_kwarg("enable_thinking", False),
    ),
    "add_generation_prompt": ({"add_generation_prompt": False}, template_kwarg("add_generation_prompt", False)),
    # the Qwen3 front parses reasoning: its answers carry the (here empty) reasoning field unless asked not to
    "include_reasoning": (
        {"include_reasoning": False},
        Response(lambda r: "reasoning_content" not in r.json()["choices"][0]["message"]),
    ),
    # the prompt as the chat template rendered it: the recording tokenizer's render (its messages and arguments)
    "return_prompt_text": (
        {"return_prompt_text": True},
        Response(
            lambda r: r.json()["prompt_text"] == "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"
        ),
    ),
    "continue_final_message": (
        {
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        template_kwarg("continue_final_message", True),
    ),
    "reasoning_effort": ({"reasoning_effort": "low"}, template_kwarg("reasoning_effort", "low")),
    "logprobs": ({"logprobs": True}, Engine(lambda p: p.sampling.logprobs == 0)),
    "top_logprobs": ({"logprobs": True, "top_logprobs": 2}, Engine(lambda p: p.sampling.logprobs == 2)),
    # the last message's content before the answer's when it has the answer's role (here the user's: none;
    # tests/unit/front/test_vllm_front_options.py)
    "echo": ({"echo": True}, Response(lambda r: r.status_code == 200)),
    "metadata": ({"metadata": {"team": "a"}}, INFORMATIONAL),
    "safety_identifier": ({"safety_identifier": "hash-1"}, INFORMATIONAL),
    "prompt_cache_key": ({"prompt_cache_key": "conversation-7"}, INFORMATIONAL),
    "store": ({"store": True}, REFUSED),
    "service_tier": ({"service_tier": "flex"}, REFUSED),
    "modalities": ({"modalities": ["text", "audio"]}, REFUSED),
    "chat_template": ({"chat_template": "{{ messages }}"}, REFUSED),
    "audio": ({"audio": {"voice": "alloy", "format": "wav"}}, REFUSED),
    "functions": ({"functions": [TOOLS[0]["function"]]}, REFUSED),
    "function_call": ({"function_call": "auto"}, REFUSED),
    "prediction": ({"prediction": {"type": "content", "content": "x"}}, REFUSED),
    "moderation": ({"moderation": {"model": "omni-moderation-latest"}}, REFUSED),
    "prompt_cache_options": ({"prompt_cache_options": {"mode": "explicit"}}, REFUSED),
    "prompt_cache_retention": ({"prompt_cache_retention": "24h"}, REFUSED),
    "verbosity": ({"verbosity": "low"}, REFUSED),
    "web_search_options": ({"web_search_options": {}}, REFUSED),
    "mm_processor_kwargs": ({"mm_processor_kwargs": {}}, REFUSED),
}
COMPLETION_CASES: dict[str, tuple[dict[str, Any], Expect]] = {
    **SHARED_CASES,
    "prompt": ({"prompt": [9707, 11]}, Prompt(lambda t, s: s.prompt_ids == [9707, 11])),
    "logprobs": ({"logprobs": 1}, Engine(lambda p: p.sampling.logprobs == 1)),
    # the played engine echoes the prompt: echo puts the prompt before that
    "echo": ({"echo": True}, Response(lambda r: r.json()["choices"][0]["text"] == "Hello there" * 2)),
    "suffix": ({"suffix": "x"}, REFUSED),
    "prompt_embeds": ({"prompt_embeds": "AAAA"}, REFUSED),
    "logprob_token_ids": (
        {"logprobs": 1, "logprob_token_ids": [9707]},
        VllmEngine(lambda p: p.sampling.logprob_token_ids == [9707]),
    ),
}
ENDPOINTS = {
    "chat": ("/v1/chat/completions", CHAT_CASES, OPENAI_CHAT_FIELDS | VLLM_FIELDS | VLLM_CHAT_FIELDS),
    "completions": (
        "/v1/completions",
        COMPLETION_CASES,
        OPENAI_COMPLETION_FIELDS | VLLM_FIELDS | VLLM_COMPLETION_FIELDS,
    ),
}
BASELINE = {
    "chat": {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 3},
    "completions": {"prompt": "Hello there", "max_tokens": 3},
}
STRUCTS = {"chat": ChatCompletionRequest, "completions": CompletionRequest}


@pytest.fixture(scope="module")
def recording() -> RecordingTokenizer:
    return RecordingTokenizer(load_fixture_tokenizer("qwen3"))


@pytest.fixture(scope="module")
def front(recording: RecordingTokenizer) -> Iterator[FrontUnderTest]:
    with running_front(recording) as under_test:
        yield under_test


@pytest.fixture(scope="module")
def vllm_front(recording: RecordingTokenizer) -> Iterator[FrontUnderTest]:
    """A front whose engine source is vLLM's engine core (played here too)."""
    with running_front(recording, **{"engine.source": "vllm", "engine.model": "qwen3-tiny"}) as under_test:
        yield under_test


def post(front: FrontUnderTest, path: str, body: dict[str, Any]) -> tuple[httpx.Response, Submit | None]:
    while not front.engine.submits.empty():
        front.engine.submits.get_nowait()
    response = httpx.post(f"{front.url}{path}", json=body, timeout=30)
    submit = front.engine.submits.get(timeout=5) if response.status_code == 200 else None
    return response, submit


@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_the_cases_cover_every_openai_and_vllm_field(endpoint: str) -> None:
    _, cases, fields = ENDPOINTS[endpoint]
    assert set(cases) == fields, "a request field has no case (a new OpenAI field?): handle it, then add its case"
    declared = set(STRUCTS[endpoint].__struct_fields__)
    assert declared <= set(cases), f"fields accepted without a case: {sorted(declared - set(cases))}"


@pytest.mark.parametrize(
    ("endpoint", "field"),
    [(endpoint, field) for endpoint in sorted(ENDPOINTS) for field in sorted(ENDPOINTS[endpoint][1])],
)
def test_each_field_is_used_or_refused(
    front: FrontUnderTest, vllm_front: FrontUnderTest, recording: RecordingTokenizer, endpoint: str, field: str
) -> None:
    path, cases, _ = ENDPOINTS[endpoint]
    extra, expect = cases[field]
    response, submit = post(front, path, {**BASELINE[endpoint], **extra})
    if isinstance(expect, (Refused, VllmEngine)):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and field in error["message"]
        assert error["code"] == "unsupported_parameter"
        if isinstance(expect, Refused):
            return
        assert "'vllm' engine source" in error["message"] and "'corpus'" in error["message"]
        response, submit = post(vllm_front, path, {**BASELINE[endpoint], **extra})
    assert response.status_code == 200, response.text
    assert submit is not None
    if isinstance(expect, (Engine, VllmEngine)):
        assert expect.check(submit.params), submit.params
    elif isinstance(expect, Prompt):
        assert expect.check(recording, submit)
    elif isinstance(expect, Response):
        assert expect.check(response)


@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_unknown_field_is_refused_by_name(front: FrontUnderTest, endpoint: str) -> None:
    path = ENDPOINTS[endpoint][0]
    response, _ = post(front, path, {**BASELINE[endpoint], "frobnicate": 1})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "frobnicate"
    response, _ = post(front, path, {**BASELINE[endpoint], "stream": True, "stream_options": {"sparkle": True}})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "stream_options.sparkle")


NULLABLE = (
    "n", "stream", "stop", "max_tokens", "temperature", "top_p", "seed", "logit_bias", "presence_penalty",
    "frequency_penalty", "stream_options", "user", "response_format", "top_k", "min_p", "repetition_penalty",
    "stop_token_ids", "logprobs", "echo", "best_of", "skip_special_tokens", "min_tokens", "ignore_eos",
    "include_stop_str_in_output", "add_special_tokens", "truncate_prompt_tokens", "return_token_ids",
    "spaces_between_special_tokens", "allowed_token_ids", "bad_words", "priority", "cache_salt", "prompt_logprobs",
)  # fmt: skip


@pytest.mark.parametrize("endpoint", sorted(ENDPOINTS))
def test_null_means_the_default(front: FrontUnderTest, endpoint: str) -> None:
    path = ENDPOINTS[endpoint][0]
    extra = dict.fromkeys(NULLABLE)
    if endpoint == "chat":
        extra.update(dict.fromkeys(("top_logprobs", "max_completion_tokens", "tools", "tool_choice")))
        extra.update(dict.fromkeys(("add_generation_prompt", "continue_final_message", "parallel_tool_calls")))
    body = {key: value for key, value in BASELINE[endpoint].items() if key != "max_tokens"}
    response, submit = post(front, path, {**body, **extra})
    assert response.status_code == 200, response.text
    assert submit is not None
    defaults = RequestParams(max_tokens=front.server.config.front.max_tokens_default)
    if endpoint == "chat":  # the embedded Qwen3's chats are parsed for reasoning (front.reasoning_parser = "auto")
        defaults = msgspec.structs.replace(
            defaults, detok=msgspec.structs.replace(defaults.detok, reasoning_parser="qwen3")
        )
    assert msgspec.structs.asdict(submit.params) == msgspec.structs.asdict(defaults)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_json": SCHEMA, "guided_regex": "a"}, "guided_regex"),
        ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "guided_choice"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs"),
        ({"structured_outputs": {"disable_fallback": True, "regex": "a"}}, "structured_outputs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
        ({"top_p": 0}, "top_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"temperature": 2.5}, "temperature"),
        ({"return_tokens_as_token_ids": "yes"}, "return_tokens_as_token_ids"),
    ],
)
def test_bad_constraints_and_values_name_the_field(front: FrontUnderTest, extra: dict[str, Any], param: str) -> None:
    response, _ = post(front, "/v1/chat/completions", {**BASELINE["chat"], **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_named_tool_choice_and_json_object(front: FrontUnderTest) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    _, submit = post(front, "/v1/chat/completions", {**BASELINE["chat"], "tools": TOOLS, "tool_choice": named})
    assert submit is not None
    parameters = json.dumps(TOOLS[0]["function"]["parameters"], separators=(",", ":"))
    assert submit.params.sampling.constraint == Constraint("json_schema", parameters)
    for choice in ("none", "auto"):
        _, submit = post(front, "/v1/chat/completions", {**BASELINE["chat"], "tools": TOOLS, "tool_choice": choice})
        assert submit is not None and submit.params.sampling.constraint is None
    body = {**BASELINE["completions"], "response_format": {"type": "json_object"}}
    _, submit = post(front, "/v1/completions", body)
    assert submit is not None and submit.params.sampling.constraint == Constraint("json_object")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [5, -1]}, "allowed_token_ids"),
        ({"allowed_token_ids": [151669]}, "allowed_token_ids"),  # the embedded Qwen3 tokenizer has 151,669 ids
        ({"allowed_token_ids": "1,2"}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
        ({"bad_words": ["ok", " \t"]}, "bad_words"),
        ({"bad_words": "x"}, "bad_words"),
        ({"priority": 2**63}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": "a/b"}, "cache_salt"),
        ({"cache_salt": "x" * 129}, "cache_salt"),
        ({"cache_salt": 7}, "cache_salt"),
        ({"return_token_ids": "yes"}, "return_token_ids"),
        ({"prompt_logprobs": -2}, "prompt_logprobs"),
        ({"prompt_logprobs": 1.5}, "prompt_logprobs"),
        ({"prompt_logprobs": "1"}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt_logprobs": -1, "stream": True}, "prompt_logprobs"),
        ({"prompt_logprobs": 1, "echo": True, "max_tokens": 0}, "prompt_logprobs"),
        ({"thinking_token_budget": -2}, "thinking_token_budget"),
        ({"thinking_token_budget": 1.5}, "thinking_token_budget"),
        ({"thinking_token_budget": True}, "thinking_token_budget"),
        ({"vllm_xargs": {"a": {"nested": 1}}}, "vllm_xargs"),
        ({"vllm_xargs": ["a"]}, "vllm_xargs"),
        ({"stream_interval": 0}, "stream_interval"),
    ],
)
def test_bad_engine_field_values_name_the_field(vllm_front: FrontUnderTest, extra: dict[str, Any], param: str) -> None:
    """vLLM's own checks of these fields (protocol and SamplingParams), made by the front before any engine work."""
    response, _ = post(vllm_front, "/v1/completions", {**BASELINE["completions"], **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_engine_field_defaults_are_accepted_on_any_engine_source(front: FrontUnderTest) -> None:
    """What asks nothing of the engine (vLLM's defaults) is no reason to refuse a request."""
    body = {**BASELINE["completions"], "bad_words": [], "priority": 0, "return_token_ids": False}
    response, submit = post(front, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert submit is not None and (submit.params.priority, submit.params.sampling.bad_words) == (0, [])
    assert "token_ids" not in response.json()["choices"][0]


def test_the_front_refuses_what_its_engine_announces_it_does_not_pass_on(recording: RecordingTokenizer) -> None:
    """The engine's EngineStats say which fields it does not pass on, whatever engine.source the front was given:
    an engine that takes every field gets bad_words and the X-Session-ID header on a corpus-configured front; one
    that refuses temperature has it refused on a vllm-configured one."""
    body = {**BASELINE["completions"], "bad_words": ["x"]}
    with running_front(recording, refused_fields=()) as open_front:
        response, submit = post(open_front, "/v1/completions", body)
        assert response.status_code == 200, response.text
        assert submit is not None and submit.params.sampling.bad_words == ["x"]
        response = httpx.post(
            f"{open_front.url}/v1/completions", json=BASELINE["completions"], headers={"X-Session-ID": "s1"}
        )
        assert response.status_code == 200 and open_front.engine.submits.get(timeout=5).params.session_id == "s1"
    overrides = {"engine.source": "vllm", "engine.model": "qwen3-tiny"}
    with running_front(recording, refused_fields=("temperature",), **overrides) as narrow_front:
        response, _ = post(narrow_front, "/v1/completions", {**BASELINE["completions"], "temperature": 0.5})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("temperature", "unsupported_parameter")
        assert "'vllm'" in error["message"]
        response, submit = post(narrow_front, "/v1/completions", body)
        assert response.status_code == 200 and submit is not None and submit.params.sampling.bad_words == ["x"]


def test_spaces_between_special_tokens_needs_a_tokenizer_that_knows_its_added_tokens() -> None:
    """vLLM's rule for it reads the tokenizer's added tokens (a Hugging Face tokenizer's); with special tokens skipped
    it changes nothing, so any tokenizer takes it then."""
    limits = Limits.from_config(load_config(None, {}), "mock", MockTokenizer())
    body = {**BASELINE["completions"], "spaces_between_special_tokens": False}
    assert check_generation(decode_completion(json.dumps(body).encode()), limits).params.detok == DetokParams(
        spaces_between_special_tokens=False
    )
    with pytest.raises(APIError) as refused:
        check_generation(decode_completion(json.dumps({**body, "skip_special_tokens": False}).encode()), limits)
    assert refused.value.param == "spaces_between_special_tokens" and "Hugging Face" in refused.value.message
