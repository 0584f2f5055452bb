"""The front under bad input and faults: malformed bodies, auth, size limits, client disconnects, a stalled
client, timeouts, engine rejects and errors, an absent engine, garbage bus frames. Real uvicorn, real ZMQ, a
test-played engine + worker."""

from __future__ import annotations

import json
import queue
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from helpers.front_harness import FrontUnderTest, decode_plan, running_front

from detok_worker.bus.codec import encode
from detok_worker.bus.messages import Abort, Hello, Submit, TextDelta

openai = pytest.importorskip("openai")

ABORT_WAIT_S = 5.0  # generous for a loaded CI box; the measured latency is reported by the tests' asserts


@pytest.fixture(scope="module")
def front(tokenizer: Any) -> Iterator[FrontUnderTest]:
    overrides = {
        "front.max_request_bytes": 200_000,
        "front.max_pending_chars": 50_000,
        "worker.max_stop_strings": 16,
        "worker.max_stop_string_chars": 64,
    }
    with running_front(tokenizer, **overrides) as under_test:
        yield under_test


@pytest.fixture(autouse=True)
def echo_by_default(front: FrontUnderTest) -> None:
    front.set_plan(front.echo_plan)


def endless_plan(submit: Submit) -> list[TextDelta]:
    """A request that streams "tick " forever (until aborted)."""
    return [TextDelta(submit.rid, 5 * i, "tick ", i + 1) for i in range(100_000)]


def wait_abort(front: FrontUnderTest, rid: str | None = None) -> tuple[Abort, float]:
    deadline = time.monotonic() + ABORT_WAIT_S
    while True:
        abort, at = front.engine.aborts.get(timeout=max(0.01, deadline - time.monotonic()))
        if rid is None or abort.rid == rid:
            return abort, at


def drain(q: queue.Queue[Any]) -> None:
    while not q.empty():
        q.get_nowait()


def assert_error_body(response: httpx.Response) -> dict[str, Any]:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    body = response.json()
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and {"param", "code"} <= set(error)
    return error


def ok_completion(front: FrontUnderTest) -> None:
    response = httpx.post(f"{front.url}/v1/completions", json={"prompt": "still fine"}, timeout=10)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "still fine"


COMPLETION_BODIES: list[tuple[bytes, int]] = [
    (b"", 400),
    (b"{", 400),
    (b"[]", 400),
    (b'"just a string"', 400),
    (b"null", 400),
    (b'{"prompt": 5}', 400),
    (b'{"max_tokens": 5}', 400),
    (b'{"model": "no-such-model", "prompt": "x"}', 404),
    (b'{"prompt": "x", "max_tokens": -1}', 400),
    (b'{"prompt": "x", "max_tokens": 0}', 400),
    (b'{"prompt": "x", "max_tokens": 1000000000000000000000000000000}', 400),
    (b'{"prompt": "x", "max_tokens": "10"}', 400),
    (b'{"prompt": "x", "max_tokens": 1.5}', 400),
    (json.dumps({"prompt": "x", "stop": [f"s{i}" for i in range(10_000)]}).encode(), 400),
    (json.dumps({"prompt": "x", "stop": "y" * 65}).encode(), 400),
    (b'{"prompt": "x", "stop": [""]}', 400),
    (b'{"prompt": "x", "stop": [1, 2]}', 400),
    (b'{"prompt": "\xff\xfe invalid utf-8"}', 400),
    (b'{"prompt": "lone surrogate \\ud800"}', 400),
    (b'{"prompt": "x", "n": 0}', 400),
    (b'{"prompt": "x", "n": 17}', 400),
    (b'{"prompt": "x", "n": 2, "seed": 9223372036854775807}', 400),
    (b'{"prompt": []}', 400),
    (b'{"prompt": [-1]}', 400),
    (b'{"prompt": [1000000000]}', 400),
    (b'{"prompt": ["a", ""]}', 400),  # a batch (OpenAI's list of prompts) with an empty one
    (b'{"prompt": [[1, 2], []]}', 400),
    (b'{"prompt": ["a", [1]]}', 400),  # strings and token lists mixed
    (b'{"prompt": [1, "a"]}', 400),
    (b'{"prompt": ""}', 400),
    (b'{"prompt": "x", "temperature": 1e999}', 400),
    (b'{"prompt": "x", "temperature": -1}', 400),
    (b'{"prompt": "x", "top_p": NaN}', 400),
    (b'{"prompt": "x", "stop_token_ids": [-5]}', 400),
    (b'{"prompt": "x", "max_tokens": 4, "min_tokens": 5}', 400),
    (b'{"prompt": "x", "stream_options": {"include_usage": true}}', 400),
    (b'{"prompt": "x", "logprobs": 21}', 400),
    (b'{"prompt": "x", "logprobs": -1}', 400),
    (b'{"prompt": "x", "logprobs": true}', 400),
    (b'{"prompt": "x", "echo": 5}', 400),
    (b'{"prompt": "x", "echo": true, "max_tokens": -1}', 400),
    (b'{"prompt": "x", "stream": "yes"}', 400),
    (b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400),
]

CHAT_BODIES: list[tuple[Any, int]] = [
    ({"messages": []}, 400),
    ({}, 400),
    ({"messages": "hello"}, 400),
    ({"messages": ["hello"]}, 400),
    ({"messages": [{"content": "no role"}]}, 400),
    ({"messages": [{"role": 5, "content": "x"}]}, 400),
    ({"messages": [{"role": "user", "content": 5}]}, 400),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": "call"}]}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": 1}}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": [1]}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "tools": "x"}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ 1 }}"}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "continue_final_message": True}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, 400),
    ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4o"}, 404),
    (
        {
            "messages": [
                {"role": "user", "content": "x", "extra": [[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]}
            ]
        },
        200,
    ),
]


def test_malformed_completion_bodies(front: FrontUnderTest) -> None:
    with httpx.Client(base_url=front.url, timeout=10) as client:
        for body, status in COMPLETION_BODIES:
            response = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
            assert response.status_code == status, (body[:80], response.text)
            assert_error_body(response)
    ok_completion(front)
    assert httpx.get(f"{front.url}/health").status_code == 200


def test_malformed_chat_bodies(front: FrontUnderTest) -> None:
    with httpx.Client(base_url=front.url, timeout=10) as client:
        for body, status in CHAT_BODIES:
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == status, (body, response.text)
            if status != 200:
                assert_error_body(response)
        nested = b'{"messages": [{"role": "user", "content": "x", "deep": ' + b"[" * 50_000 + b"]" * 50_000 + b"}]}"
        assert_error_body(client.post("/v1/chat/completions", content=nested))
    ok_completion(front)


def test_wrong_paths_and_methods(front: FrontUnderTest) -> None:
    assert assert_error_body(httpx.get(f"{front.url}/v1/completions"))["message"]
    assert httpx.get(f"{front.url}/v1/completions").status_code == 405
    response = httpx.post(f"{front.url}/v1/nothing", json={})
    assert response.status_code == 404 and assert_error_body(response)["type"] == "not_found_error"


def test_request_too_large(front: FrontUnderTest) -> None:
    big = json.dumps({"prompt": "x" * 300_000}).encode()
    response = httpx.post(f"{front.url}/v1/completions", content=big)
    assert response.status_code == 413 and assert_error_body(response)["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no content-length: the limit holds while streaming the body in
        yield b'{"prompt": "'
        for _ in range(30):
            yield b"y" * 10_000
        yield b'"}'

    response = httpx.post(f"{front.url}/v1/completions", content=chunks())
    assert response.status_code == 413
    ok_completion(front)


def test_api_key(tokenizer: Any) -> None:
    with running_front(tokenizer, **{"front.api_key": "s3cret"}) as keyed:
        url = f"{keyed.url}/v1/completions"
        assert assert_error_body(httpx.post(url, json={"prompt": "x"}))["code"] == "invalid_api_key"
        assert httpx.post(url, json={"prompt": "x"}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(url, json={"prompt": "x"}, headers={"Authorization": "Basic s3cret"}).status_code == 401
        assert httpx.get(f"{keyed.url}/v1/models").status_code == 401
        assert httpx.get(f"{keyed.url}/health").status_code == 200  # health stays open for supervisors
        with openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="s3cret", max_retries=0) as client:
            assert client.completions.create(model=tokenizer.name, prompt="hi").choices[0].text == "hi"
        with (
            openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="nope", max_retries=0) as client,
            pytest.raises(openai.AuthenticationError),
        ):
            client.completions.create(model=tokenizer.name, prompt="hi")


def test_stream_disconnect_aborts_in_engine(front: FrontUnderTest) -> None:
    front.set_plan(endless_plan)
    drain(front.engine.aborts)
    drain(front.engine.submits)
    body = {"prompt": "go", "stream": True}
    with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=10) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert any("tick" in line for line in received)
        rid = front.engine.submits.get(timeout=1).rid
        closed_at = time.monotonic()
    abort, at = wait_abort(front, rid)
    assert abort.rid == rid and at - closed_at < ABORT_WAIT_S
    assert front.server.front.dispatcher.live_rids == 0


def test_non_streaming_disconnect_aborts_in_engine(front: FrontUnderTest) -> None:
    front.set_plan(endless_plan)
    drain(front.engine.aborts)
    drain(front.engine.submits)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{front.url}/v1/completions", json={"prompt": "go"}, timeout=0.5)
    rid = front.engine.submits.get(timeout=1).rid
    abort, _ = wait_abort(front, rid)
    assert abort.rid == rid
    assert front.server.front.dispatcher.live_rids == 0


def test_stalled_client_is_cut_off(front: FrontUnderTest) -> None:
    """A client that stops reading: the front buffers at most max_pending_chars for it, then aborts."""
    big = "x" * 10_000

    def flood(submit: Submit) -> list[TextDelta]:
        return [TextDelta(submit.rid, len(big) * i, big, i + 1) for i in range(2_000)]

    front.set_plan(flood)
    drain(front.engine.aborts)
    before = front.server.front.dispatcher.counters["client_too_slow"]
    request = json.dumps({"prompt": "go", "stream": True}).encode()
    with socket.socket() as raw:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect(("127.0.0.1", front.server.config.front.port))
        raw.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(request)}\r\n\r\n".encode()
            + request
        )
        wait_abort(front)  # never read a byte: the front must give up on us
    assert front.server.front.dispatcher.counters["client_too_slow"] == before + 1
    assert front.server.front.dispatcher.live_rids == 0
    front.set_plan(front.echo_plan)
    ok_completion(front)


def test_request_timeout(tokenizer: Any) -> None:
    with running_front(tokenizer, **{"front.request_timeout_s": 0.3}) as short:
        short.set_plan(lambda submit: [TextDelta(submit.rid, 0, "", i) for i in range(100_000)])
        response = httpx.post(f"{short.url}/v1/completions", json={"prompt": "x"}, timeout=10)
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
        assert wait_abort(short)[0].rid.startswith("cmpl-")


def test_engine_reject(front: FrontUnderTest, tokenizer: Any) -> None:
    front.set_plan(lambda submit: "no live worker")
    response = httpx.post(f"{front.url}/v1/completions", json={"prompt": "x"}, timeout=10)
    assert response.status_code == 503 and "no live worker" in response.json()["error"]["message"]
    with (
        openai.OpenAI(base_url=f"{front.url}/v1", api_key="x", max_retries=0) as client,
        pytest.raises(openai.APIError, match="no live worker"),
    ):
        list(
            client.chat.completions.create(
                model=tokenizer.name, messages=[{"role": "user", "content": "x"}], stream=True
            )
        )


def test_one_failed_choice_fails_the_request_and_stops_the_others(front: FrontUnderTest) -> None:
    """n = 3, choice 1 rejected by the engine, the others endless: the request ends with choice 1's error (as
    vLLM ends it) and the two others are aborted in the engine, streamed or not."""
    front.set_plan(lambda submit: "choice one failed" if submit.rid.endswith("-1") else endless_plan(submit))
    for stream in (False, True):
        for pending in (front.engine.submits, front.engine.aborts):
            while not pending.empty():
                pending.get_nowait()
        response = httpx.post(f"{front.url}/v1/completions", json={"prompt": "x", "n": 3, "stream": stream})
        if stream:
            events = [line for line in response.text.split("\n\n") if line]
            assert events[-1] == "data: [DONE]"
            assert json.loads(events[-2][len("data: ") :])["error"]["message"].endswith("choice one failed")
        else:
            assert response.status_code == 503 and "choice one failed" in response.json()["error"]["message"]
        submitted = [front.engine.submits.get(timeout=5).rid for _ in range(3)]
        base = submitted[0][: -len("-0")]
        assert submitted == [f"{base}-0", f"{base}-1", f"{base}-2"]
        assert {wait_abort(front)[0].rid for _ in range(2)} == {f"{base}-0", f"{base}-2"}


def test_detokenizer_error_mid_stream(front: FrontUnderTest, tokenizer: Any) -> None:
    def failing(submit: Submit) -> list[TextDelta]:
        good = decode_plan(tokenizer, submit.rid, submit.prompt_ids)[:-1]
        offset = sum(len(delta.text) for delta in good)
        return [
            *good,
            TextDelta(
                submit.rid,
                offset,
                "",
                len(good) + 1,
                finish="error",
                stop_reason=None,
                error="token id 999999 is out of range",
            ),
        ]

    front.set_plan(failing)
    body = {"prompt": "Hello world and more", "stream": True}
    with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=10) as response:
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: ") :])["error"]
    assert "out of range" in error["message"] and error["type"] == "engine_error"
    streamed = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-2])
    assert "Hello world and more".startswith(streamed) and streamed
    response = httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hello"}, timeout=10)
    assert response.status_code == 502 and "out of range" in response.json()["error"]["message"]


def test_chat_template_errors_are_400(tokenizer: Any) -> None:
    from detok_worker.tokenizer import create_tokenizer

    strict = create_tokenizer(
        str(FIXTURE_TOKENIZER_DIRS["qwen3"]),
        chat_template="{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}ok",
    )
    with running_front(strict) as under_test:
        url = f"{under_test.url}/v1/chat/completions"
        response = httpx.post(url, json={"messages": [{"role": "user", "content": "x"}]})
        assert response.status_code == 400 and assert_error_body(response)["code"] == "chat_template_error"
        assert "system first" in response.json()["error"]["message"]
        response = httpx.post(url, json={"messages": [{"role": "system", "content": "x"}]}, timeout=10)
        assert response.status_code == 200
    no_template = load_fixture_tokenizer("mistral-sp-v1")
    with running_front(no_template) as under_test:
        response = httpx.post(
            f"{under_test.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert response.status_code == 400 and "chat template" in assert_error_body(response)["message"]
        assert httpx.post(f"{under_test.url}/v1/completions", json={"prompt": "x"}, timeout=10).status_code == 200


def test_without_engine_the_front_says_503(tokenizer: Any) -> None:
    with running_front(tokenizer, send_stats=False) as lonely:
        health = httpx.get(f"{lonely.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        response = httpx.post(f"{lonely.url}/v1/completions", json={"prompt": "x"})
        assert response.status_code == 503 and assert_error_body_any(response)["type"] == "service_unavailable"


def assert_error_body_any(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert isinstance(error["message"], str) and {"type", "param", "code"} <= set(error)
    return error


def test_garbage_frames_are_counted_and_skipped(front: FrontUnderTest) -> None:
    frames = [b"", b"\x00\xff garbage", encode(Hello("w", 1)), encode({"not": "a message"}), b"\x93\x01\x02"]
    frames += [bytes([i]) * (i + 1) for i in range(0, 256, 17)]
    for frame in frames:
        front.engine.send_raw(frame)
    deadline = time.monotonic() + 5
    while sum(front.server.front.dispatcher.stats()["front"]["bad_frames"].values()) < len(frames):
        assert time.monotonic() < deadline, front.server.front.dispatcher.stats()
        time.sleep(0.02)
    ok_completion(front)
    assert httpx.get(f"{front.url}/health").status_code == 200
