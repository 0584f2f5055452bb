"""The front's utility endpoints and HTTP plumbing, in-process against a played engine: /tokenize and /detokenize
(vLLM's shapes) on the embedded Qwen3, /version, /v1/models/{id} with max_model_len, CORS, X-Request-Id, chat ids,
and an engine's Reject naming a parameter becoming a 400."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.front_harness import FrontUnderTest, running_front

from detok_worker.bus.codec import encode
from detok_worker.bus.messages import Reject, Submit

openai = pytest.importorskip("openai")

ALLOWED = "https://app.example.com"
TEXTS = ["Hello there! How are you today?", "日本語と中文 😀👍🏽 family 👨‍👩‍👧‍👦", "def f(x):\n    return [1, 2]\n"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 😀"}]


@pytest.fixture(scope="module")
def front(tokenizer: Any) -> Iterator[FrontUnderTest]:
    with running_front(tokenizer, **{"front.cors_allowed_origins": [ALLOWED]}) as under_test:
        yield under_test


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_detokenize_round_trip(front: FrontUnderTest, tokenizer: Any, text: str) -> None:
    response = httpx.post(f"{front.url}/tokenize", json={"prompt": text, "return_token_strs": True})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["tokens"] == tokenizer.encode(text, add_special_tokens=True).ids
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 131072
    assert body["token_strs"] == [tokenizer.id_to_token(i) for i in body["tokens"]]
    back = httpx.post(f"{front.url}/detokenize", json={"tokens": body["tokens"], "model": "qwen3"})
    assert back.status_code == 200 and back.json() == {"prompt": text}


def test_tokenize_chat_matches_the_chat_prompt(front: FrontUnderTest, tokenizer: Any) -> None:
    response = httpx.post(f"{front.url}/tokenize", json={"messages": MESSAGES})
    body = response.json()
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert body["tokens"] == tokenizer.encode(rendered).ids and body["token_strs"] is None
    # the same ids a chat completion submits to the engine
    httpx.post(f"{front.url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2})
    submit = front.engine.submits.get(timeout=5)
    while not front.engine.submits.empty():
        submit = front.engine.submits.get_nowait()
    assert submit.prompt_ids == body["tokens"]
    text = httpx.post(f"{front.url}/detokenize", json={"tokens": body["tokens"]}).json()["prompt"]
    assert text == rendered  # special tokens kept, like vLLM
    plain = httpx.post(f"{front.url}/tokenize", json={"messages": MESSAGES, "add_generation_prompt": False}).json()
    assert plain["count"] < body["count"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/tokenize", {"prompt": "x", "extra": 1}, "extra"),
        ("/tokenize", {"messages": [{"role": "", "content": "x"}]}, "messages"),
    ],
)
def test_tokenize_errors_name_the_field(front: FrontUnderTest, path: str, body: dict[str, Any], param: str) -> None:
    response = httpx.post(f"{front.url}{path}", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    other_model = {"model": "gpt-4", **({"tokens": [1]} if path == "/detokenize" else {"prompt": "x"})}
    assert httpx.post(f"{front.url}{path}", json=other_model).status_code == 404


def test_version_and_model_card(front: FrontUnderTest, tokenizer: Any) -> None:
    version = importlib.metadata.version("detok")
    assert httpx.get(f"{front.url}/version").json() == {"version": version, "detok_version": version}
    card = httpx.get(f"{front.url}/v1/models/{tokenizer.name}").json()
    assert (card["id"], card["object"], card["max_model_len"]) == (tokenizer.name, "model", 131072)
    assert httpx.get(f"{front.url}/v1/models").json()["data"] == [card]
    missing = httpx.get(f"{front.url}/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    with openai.OpenAI(base_url=f"{front.url}/v1", api_key="x", max_retries=0) as client:
        assert client.models.retrieve(tokenizer.name).id == tokenizer.name


def test_max_model_len_from_the_config(tokenizer: Any) -> None:
    with running_front(tokenizer, **{"front.max_model_len": 4096}) as front:
        assert httpx.get(f"{front.url}/v1/models").json()["data"][0]["max_model_len"] == 4096
        assert httpx.post(f"{front.url}/tokenize", json={"prompt": "a"}).json()["max_model_len"] == 4096


def test_cors_preflight(front: FrontUnderTest) -> None:
    headers = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    allowed = httpx.options(f"{front.url}/v1/chat/completions", headers={**headers, "Origin": ALLOWED})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in allowed.headers["access-control-allow-methods"]
    other = httpx.options(f"{front.url}/v1/chat/completions", headers={**headers, "Origin": "https://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    simple = httpx.get(f"{front.url}/v1/models", headers={"Origin": ALLOWED})
    assert simple.headers["access-control-allow-origin"] == ALLOWED
    assert "x-request-id" in simple.headers["access-control-expose-headers"].lower()


def test_cors_off_by_default(tokenizer: Any) -> None:
    with running_front(tokenizer) as front:
        preflight = httpx.options(
            f"{front.url}/v1/models", headers={"Origin": ALLOWED, "Access-Control-Request-Method": "GET"}
        )
        assert preflight.status_code == 405 and "access-control-allow-origin" not in preflight.headers


def test_request_id_echoed_and_in_the_rid(front: FrontUnderTest) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2}
    response = httpx.post(f"{front.url}/v1/chat/completions", json=body, headers={"X-Request-Id": "trace 42/a"})
    assert response.headers["x-request-id"] == "trace 42/a"
    rid = response.json()["id"]
    assert rid.startswith("chatcmpl-trace_42_a-") and len(rid) == len("chatcmpl-trace_42_a-") + 12
    own = httpx.post(f"{front.url}/v1/chat/completions", json=body)
    assert own.json()["id"] == f"chatcmpl-{own.headers['x-request-id']}"
    completion = httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
    assert completion.json()["id"] == f"cmpl-{completion.headers['x-request-id']}"
    assert httpx.get(f"{front.url}/health", headers={"X-Request-Id": "h1"}).headers["x-request-id"] == "h1"
    long = "x" * 500
    rid = httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi"}, headers={"X-Request-Id": long}).json()["id"]
    assert rid.startswith("cmpl-" + "x" * 64 + "-") and len(rid) == len("cmpl-") + 64 + 13


def test_chat_ids_with_the_openai_client(front: FrontUnderTest, tokenizer: Any) -> None:
    with openai.OpenAI(base_url=f"{front.url}/v1", api_key="x", max_retries=0) as client:
        whole = client.chat.completions.create(model=tokenizer.name, messages=MESSAGES, max_tokens=3)
        assert whole.id.startswith("chatcmpl-")
        chunks = list(client.chat.completions.create(model=tokenizer.name, messages=MESSAGES, stream=True))
        assert chunks[0].id.startswith("chatcmpl-") and {chunk.id for chunk in chunks} == {chunks[0].id}


def test_engine_reject_naming_a_parameter_is_a_400(front: FrontUnderTest) -> None:
    """A gRPC engine without a field for a parameter: the gateway's Reject names it, the client gets a 400."""

    def reject(param: str | None) -> Any:
        def plan(submit: Submit) -> Any:
            front.engine.send_raw(encode(Reject(submit.rid, "no field for it", param)))
            return front.echo_plan(submit)  # never reaches the client: the Reject is first

        return plan

    try:
        front.set_plan(reject("seed"))
        response = httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi", "seed": 7})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "seed" and "seed" in response.json()["error"]["message"]
        front.set_plan(reject(None))
        assert httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi"}).status_code == 503
    finally:
        front.set_plan(front.echo_plan)
