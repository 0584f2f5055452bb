"""Through a real `detok serve` (echo engine stub) with the official `openai` client: sampling and constraint
parameters reach the engine (its trace recorder writes every Submit's RequestParams), what cannot be honoured is
a 400 naming it, /tokenize and /detokenize round-trip on the embedded Qwen3, CORS, X-Request-Id, chatcmpl- ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.serve_helpers import ServeProcess, http_json, serving

from detok_worker.bus.messages import Constraint
from detok_worker.trace.format import read_trace

openai = pytest.importorskip("openai")

ALLOWED = "https://app.example.com"
MESSAGES = [{"role": "user", "content": "Name a colour. 😀"}]


SERVE_ARGS = ("--workers", "1", "--source", "echo", "--step-interval-ms", "2")


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving(*SERVE_ARGS, "--set", f'front.cors_allowed_origins=["{ALLOWED}"]') as process:
        yield process


@pytest.fixture
def client(service: ServeProcess) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0, timeout=30) as api:
        yield api


def model_of(service: ServeProcess) -> str:
    return http_json(f"{service.url}/v1/models")[1]["data"][0]["id"]


def test_parameters_reach_the_engine(tmp_path: Path) -> None:
    trace = tmp_path / "engine.trace"
    with (
        serving(*SERVE_ARGS, "--set", f"engine.record={trace}") as process,
        openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=30) as client,
    ):
        model = model_of(process)
        chat = client.chat.completions.create(
            model=model,
            messages=MESSAGES,
            max_tokens=4,
            temperature=0.3,
            top_p=0.9,
            seed=42,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            logit_bias={"13": 3},
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": {"type": "object"}}},
            extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2},
        )
        completion = client.completions.create(
            model=model, prompt="Hi", max_tokens=3, extra_body={"guided_choice": ["red", "blue"]}
        )
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=model, messages=MESSAGES, store=True)
        assert refused.value.body["param"] == "store"
    recorded = {request.rid: request.params for request in read_trace(trace).requests}
    assert set(recorded) == {chat.id, completion.id} and chat.id.startswith("chatcmpl-")
    sampling = recorded[chat.id].sampling
    assert (sampling.temperature, sampling.top_p, sampling.seed, sampling.top_k) == (0.3, 0.9, 42, 5)
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, -0.5)
    assert (sampling.min_p, sampling.repetition_penalty, sampling.logit_bias) == (0.1, 1.2, {13: 3.0})
    assert sampling.constraint == Constraint("json_schema", '{"type":"object"}')
    assert recorded[completion.id].sampling.constraint == Constraint("choice", choices=["red", "blue"])


def test_tokenize_detokenize_round_trip(service: ServeProcess) -> None:
    text = "Grüße, 世界! 👨‍👩‍👧‍👦 def f(): pass"
    tokens = httpx.post(f"{service.url}/tokenize", json={"prompt": text}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 131072
    assert httpx.post(f"{service.url}/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": text}
    chat = httpx.post(f"{service.url}/tokenize", json={"messages": MESSAGES, "return_token_strs": True}).json()
    assert len(chat["token_strs"]) == chat["count"]
    rendered = httpx.post(f"{service.url}/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    assert rendered.startswith("<|im_start|>user\nName a colour. 😀<|im_end|>\n<|im_start|>assistant\n")


def test_version_and_model(service: ServeProcess, client: Any) -> None:
    assert httpx.get(f"{service.url}/version").json()["version"]
    model = model_of(service)
    assert client.models.retrieve(model).model_extra["max_model_len"] == 131072


def test_cors_preflight(service: ServeProcess) -> None:
    request = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    allowed = httpx.options(f"{service.url}/v1/completions", headers={**request, "Origin": ALLOWED})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ALLOWED
    other = httpx.options(f"{service.url}/v1/completions", headers={**request, "Origin": "https://other.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_request_id_and_chat_ids(service: ServeProcess, client: Any) -> None:
    model = model_of(service)
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=MESSAGES, max_tokens=3, extra_headers={"X-Request-Id": "client-7"}
    )
    assert raw.headers["x-request-id"] == "client-7"
    assert raw.parse().id.startswith("chatcmpl-client-7-")
    chunks = list(client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3, stream=True))
    assert all(chunk.id.startswith("chatcmpl-") for chunk in chunks)
    nulls = {"n": None, "stream": None, "stop": None, "max_tokens": None, "temperature": None}
    body = {"model": model, "messages": MESSAGES, **nulls}
    response = httpx.post(f"{service.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200 and json.loads(response.text)["object"] == "chat.completion"


def sse_events(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[len("data: ") :] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_return_token_ids_through_the_workers(service: ServeProcess) -> None:
    """The echo engine's output is the prompt's own ids and its EOS: the response carries the prompt's ids and those
    output ids (from the worker, as each delta consumed them), whole and streamed, as vLLM's server does."""
    text = "Grüße, 世界! 👨‍👩‍👧‍👦 done"
    prompt = httpx.post(f"{service.url}/tokenize", json={"prompt": text}).json()["tokens"]
    eos = httpx.post(f"{service.url}/tokenize", json={"prompt": "<|im_end|>"}).json()["tokens"]  # the stub's EOS
    body = {"model": model_of(service), "prompt": text, "max_tokens": 64, "return_token_ids": True}
    whole = httpx.post(f"{service.url}/v1/completions", json=body, timeout=30).json()["choices"][0]
    assert whole["prompt_token_ids"] == prompt
    assert whole["token_ids"] == prompt + eos and whole["text"] == text and whole["finish_reason"] == "stop"
    streamed = httpx.post(f"{service.url}/v1/completions", json={**body, "stream": True}, timeout=30)
    choices = [event["choices"][0] for event in sse_events(streamed)]
    assert [choice.get("prompt_token_ids") for choice in choices] == [prompt] + [None] * (len(choices) - 1)
    assert sum((choice["token_ids"] for choice in choices), []) == prompt + eos
    assert "".join(choice["text"] for choice in choices) == text
    chat = {"model": body["model"], "messages": MESSAGES, "max_tokens": 64, "return_token_ids": True}
    answer = httpx.post(f"{service.url}/v1/chat/completions", json=chat, timeout=30).json()
    rendered = httpx.post(f"{service.url}/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    # the echoed template holds the EOS after the user's message: the output ends there, the EOS id included
    consumed = rendered[: rendered.index(eos[0]) + 1]
    assert answer["prompt_token_ids"] == rendered and answer["choices"][0]["token_ids"] == consumed
    refused = httpx.post(f"{service.url}/v1/completions", json={**body, "allowed_token_ids": [1]}, timeout=30)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "allowed_token_ids" and "'vllm'" in error["message"]
