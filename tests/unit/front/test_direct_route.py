"""The generation routes served past Starlette's stack (front/edge.py, DirectRoutes) answer as the stack does: the same
status, body and X-Request-Id, the same access log line fields and endpoint label, for a success, a client error
and an unexpected error. CORS on puts every request through the stack, so the two fronts here compare the paths."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.front_harness import FrontUnderTest, running_front

from detok_worker.config import load_config
from detok_worker.tokenizer import load_configured_tokenizer

MESSAGES = [{"role": "user", "content": "Hi"}]
PATHS = ["/v1/chat/completions", "/v1/completions"]


@pytest.fixture(scope="module")
def fronts() -> Iterator[dict[str, FrontUnderTest]]:
    tokenizer = load_configured_tokenizer(load_config())
    with (
        running_front(tokenizer) as direct,
        running_front(tokenizer, **{"front.cors_allowed_origins": ["https://app.example.com"]}) as stack,
    ):
        yield {"direct": direct, "stack": stack}


def body_for(path: str, **extra: Any) -> dict[str, Any]:
    base = {"messages": MESSAGES} if path.endswith("chat/completions") else {"prompt": "Hi"}
    return {**base, "max_tokens": 2, **extra}


def access_fields(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, str]:
    """The fields of the request's access log line (written once the response has ended: waited for)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [r.getMessage() for r in caplog.records if r.name == "detok.access" and request_id in r.getMessage()]
        if lines or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert len(lines) == 1, lines
    fields = dict(field.split("=", 1) for field in lines[0].split(" "))
    for varying in ("rid", "ttft_ms", "duration_ms", "client"):
        fields.pop(varying)
    return fields


def answers(
    fronts: dict[str, FrontUnderTest], caplog: pytest.LogCaptureFixture, path: str, body: dict[str, Any], tag: str
) -> dict[str, tuple[int, Any, str | None, dict[str, str]]]:
    """Per front: status, JSON body (its id dropped), X-Request-Id and access log fields of one request."""
    seen = {}
    for name, front in fronts.items():
        request_id = f"{tag}-{name}"
        response = httpx.post(f"{front.url}{path}", json=body, headers={"X-Request-Id": request_id}, timeout=30)
        payload = response.json()
        if isinstance(payload, dict):
            payload.pop("id", None)
            payload.pop("created", None)
        header = response.headers.get("x-request-id")
        fields = access_fields(caplog, request_id)
        fields.pop("request_id")
        seen[name] = (response.status_code, payload, header and header.replace(name, "*"), fields)
    return seen


def test_the_direct_path_is_taken_only_without_cors(fronts: dict[str, FrontUnderTest]) -> None:
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    assert fronts["direct"].server.app.direct.match(scope).path == "/v1/chat/completions"
    assert fronts["direct"].server.app.direct.match({**scope, "method": "GET"}) is None
    assert fronts["direct"].server.app.direct.match({**scope, "path": "/v1/models"}) is None
    assert fronts["stack"].server.app.direct is None


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("extra", [{}, {"max_tokens": -1}, {"stream": True}], ids=["ok", "400", "stream"])
def test_same_answer_and_log_as_the_stack(
    fronts: dict[str, FrontUnderTest], caplog: pytest.LogCaptureFixture, path: str, extra: dict[str, Any]
) -> None:
    caplog.set_level(logging.INFO, logger="detok.access")
    body = body_for(path, **extra)
    if body.get("stream"):
        for front in fronts.values():
            response = httpx.post(f"{front.url}{path}", json=body, headers={"X-Request-Id": "s"}, timeout=30)
            assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
            assert response.headers["x-request-id"] == "s"
            assert response.headers["content-type"].startswith("text/event-stream")
        return
    seen = answers(fronts, caplog, path, body, f"same-{len(extra)}-{path[-5:]}")
    assert seen["direct"] == seen["stack"]
    assert seen["direct"][3]["path"] == path


def test_an_unexpected_error_is_a_logged_500_as_on_the_stack(
    fronts: dict[str, FrontUnderTest], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="detok.access")

    def broken(request: Any) -> None:
        raise RuntimeError("broken on purpose")

    for front in fronts.values():
        monkeypatch.setattr(front.server.front.intake, "authorize", broken)
    seen = answers(fronts, caplog, "/v1/completions", body_for("/v1/completions"), "unexpected")
    assert seen["direct"] == seen["stack"]
    status, payload, header, fields = seen["direct"]
    assert (status, payload["error"]["message"], header) == (500, "internal server error", None)
    assert fields["status"] == "500"
    unhandled = [r for r in caplog.records if r.getMessage().startswith("unhandled error on POST /v1/completions")]
    assert len(unhandled) == 2
