"""Fuzzing the front's HTTP API: schema-shaped request bodies with random values, and random bytes. Nothing may
produce a 5xx or break the server; every 4xx carries an OpenAI error body. Also checks the OpenAPI document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.front_harness import FrontUnderTest, running_front
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detok_worker.bus.messages import Submit, TextDelta

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)
small_ints = st.integers(-3, 40)
stop_values = st.none() | st.text(max_size=6) | st.lists(st.text(max_size=6), max_size=5)
shared_fields = {
    "model": st.none() | st.just("qwen3") | st.text(max_size=10),
    "max_tokens": st.none() | small_ints | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.none() | st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "stop": stop_values | json_values,
    "stop_token_ids": st.none() | st.lists(st.integers(-5, 200_000), max_size=4) | json_values,
    "min_tokens": small_ints | json_values,
    "n": st.integers(0, 3) | json_values,
    "temperature": st.floats(allow_nan=False) | json_values,
    "skip_special_tokens": st.booleans() | json_values,
    "include_stop_str_in_output": st.booleans() | json_values,
    "ignore_eos": st.booleans() | json_values,
    "random_key": json_values,
}
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "tool", "bogus"]) | json_values},
        optional={"content": st.text(max_size=30) | json_values, "tool_calls": json_values, "name": json_values},
    ),
    max_size=4,
)


def body_strategy(required: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(required, optional=shared_fields)


completion_bodies = body_strategy(
    {"prompt": st.text(max_size=40) | st.lists(st.integers(-2, 200_000), max_size=6) | json_values}
)
chat_fields = {
    "tools": st.none() | st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=3), max_size=2),
    "chat_template_kwargs": st.none()
    | st.dictionaries(st.sampled_from(["enable_thinking", "x", "namespace"]), json_values),
    "add_generation_prompt": st.booleans() | json_values,
    "continue_final_message": st.booleans(),
    "max_completion_tokens": st.none() | small_ints,
}
chat_bodies = st.fixed_dictionaries({"messages": messages | json_values}, optional={**shared_fields, **chat_fields})


def short_reply(submit: Submit) -> list[TextDelta]:
    return [TextDelta(submit.rid, 0, "ok", 1, finish="length")]


@pytest.fixture(scope="module")
def front() -> Iterator[FrontUnderTest]:
    with running_front(load_fixture_tokenizer("qwen3")) as under_test:
        under_test.set_plan(short_reply)
        yield under_test


@pytest.fixture(scope="module")
def http(front: FrontUnderTest) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=front.url, timeout=10) as client:
        yield client


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and {"type", "param", "code"} <= set(error)
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith("data: [DONE]\n\n")
    else:
        assert response.json()["choices"]


@SETTINGS
@given(body=completion_bodies)
def test_fuzz_completions(http: httpx.Client, body: dict[str, Any]) -> None:
    check(http.post("/v1/completions", content=json.dumps(body)))


@SETTINGS
@given(body=chat_bodies)
def test_fuzz_chat(http: httpx.Client, body: dict[str, Any]) -> None:
    check(http.post("/v1/chat/completions", content=json.dumps(body)))


@SETTINGS
@given(raw=st.binary(max_size=200), path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_fuzz_raw_bytes(http: httpx.Client, raw: bytes, path: str) -> None:
    check(http.post(path, content=raw))


def test_server_healthy_after_fuzzing(front: FrontUnderTest, http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    assert front.server.front.dispatcher.live_rids == 0
    response = http.post("/v1/completions", json={"prompt": "hi"})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "ok"


def test_openapi_document(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    assert document["openapi"].startswith("3.")
    schemas = document["components"]["schemas"]
    assert {"CompletionRequest", "ChatCompletionRequest", "ErrorBody"} <= set(schemas)
    assert "prompt" in schemas["CompletionRequest"]["required"]
    assert set(document["paths"]) >= {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"}
