"""Refusals the engine knows before any output reach the client as its HTTP status, never as a 200 and then an
error event: the front holds a streamed response's head until every choice has output (or ended). By the Reject's
`kind` (never its message): no worker has room for the request's stop strings -> 429 with Retry-After; outside the
engine's limits -> 400; no live worker -> 503. A Reject without a kind (an engine failure) ends a stream with an
error event as before. Also: the model name the engine serves."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.bus_rows import text_batch
from helpers.front_harness import (
    PLAYED_WORKER,
    FrontServer,
    FrontUnderTest,
    PlayedEngine,
    front_config,
    running_front,
)
from helpers.serve_helpers import wait_for

from detok_worker.bus.codec import encode
from detok_worker.bus.messages import (
    REJECT_FAILED,
    REJECT_INVALID,
    REJECT_NO_WORKER,
    REJECT_STOP_BUDGET,
    EngineStats,
    Reject,
    Submit,
    TextDelta,
)
from detok_worker.bus.sockets import BusSockets
from detok_worker.front import dispatch

REFUSAL_DELAY_S = 0.3  # the engine's Reject comes this long after the Submit (as from a step, not at once)


@pytest.fixture(scope="module")
def front(tokenizer: Any) -> Iterator[FrontUnderTest]:
    with running_front(tokenizer) as under_test:
        yield under_test


def refuse_later(front: FrontUnderTest, kind: str, *, only: str = "") -> Any:
    """A plan that Rejects (rids ending with `only`; the others get one delta and then nothing, still live) after
    REFUSAL_DELAY_S, no output before."""

    def plan(submit: Submit) -> Any:
        if not submit.rid.endswith(only):
            return [TextDelta(submit.rid, 0, "Hel", 1)]
        reject = Reject(submit.rid, f"refused as {kind}", kind=kind)
        threading.Timer(REFUSAL_DELAY_S, front.engine.send_raw, [encode(reject)]).start()
        return []

    return plan


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [
        (REJECT_STOP_BUDGET, 429, "stop_budget"),
        (REJECT_INVALID, 400, "invalid_request"),
        (REJECT_NO_WORKER, 503, None),
    ],
)
@pytest.mark.parametrize("stream", [True, False])
def test_a_refusal_before_any_output_is_the_status(front: FrontUnderTest, kind: str, status: int, code: str | None,
                                                   stream: bool) -> None:  # fmt: skip
    front.set_plan(refuse_later(front, kind))
    try:
        asked = time.monotonic()
        with httpx.stream("POST", f"{front.url}/v1/completions", json={"prompt": "Hi", "stream": stream}) as response:
            waited = time.monotonic() - asked
            body = response.read()
    finally:
        front.set_plan(front.echo_plan)
    assert response.status_code == status, body
    assert waited >= REFUSAL_DELAY_S  # the head waited for the engine's answer
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == code and f"refused as {kind}" in error["message"]
    assert response.headers.get("retry-after") == ("1" if status == 429 else None)


def test_a_reject_without_a_kind_ends_the_stream_with_an_error_event(front: FrontUnderTest) -> None:
    front.set_plan(refuse_later(front, REJECT_FAILED))
    try:
        with httpx.stream("POST", f"{front.url}/v1/completions", json={"prompt": "Hi", "stream": True}) as response:
            events = [line for line in response.iter_lines() if line.startswith("data: ")]
    finally:
        front.set_plan(front.echo_plan)
    assert response.status_code == 200 and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: ") :])["error"]["message"].endswith("refused as ")


def test_one_refused_choice_of_n_is_the_status_and_the_others_are_aborted(front: FrontUnderTest) -> None:
    while not front.engine.aborts.empty():
        front.engine.aborts.get_nowait()
    front.set_plan(refuse_later(front, REJECT_STOP_BUDGET, only="-1"))
    try:
        body = {"prompt": "Hello there, how are you doing today?", "n": 2, "stream": True}
        response = httpx.post(f"{front.url}/v1/completions", json=body)
    finally:
        front.set_plan(front.echo_plan)
    assert response.status_code == 429
    abort, _ = front.engine.aborts.get(timeout=5)  # choice 0 had output and still generated: it is stopped
    assert abort.rid.endswith("-0")


def test_a_client_gone_while_the_head_waits_aborts_its_request(front: FrontUnderTest) -> None:
    while not front.engine.aborts.empty():
        front.engine.aborts.get_nowait()
    front.set_plan(lambda submit: [])  # no output, ever
    try:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi", "stream": True}, timeout=0.5)
        abort, _ = front.engine.aborts.get(timeout=5)
        submit = front.engine.submits.get(timeout=5)
        while not front.engine.submits.empty():
            submit = front.engine.submits.get_nowait()
        assert abort.rid == submit.rid
    finally:
        front.set_plan(front.echo_plan)


def test_a_stream_with_output_starts_with_a_200_and_streams_it(front: FrontUnderTest) -> None:
    body = {"prompt": "Hello there, how are you doing today?", "stream": True, "max_tokens": 50}
    with httpx.stream("POST", f"{front.url}/v1/completions", json=body) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200 and lines[-1] == "data: [DONE]"


def test_the_engines_model_name_is_served_unless_the_config_names_one(tokenizer: Any) -> None:
    with running_front(tokenizer) as under_test:
        assert httpx.get(f"{under_test.url}/v1/models").json()["data"][0]["id"] == tokenizer.name
        under_test.engine.served_model_name = "engine-model"
        time.sleep(0.3)  # the next EngineStats names it
        assert httpx.get(f"{under_test.url}/v1/models").json()["data"][0]["id"] == "engine-model"
        answer = httpx.post(f"{under_test.url}/v1/completions", json={"prompt": "Hi", "model": "engine-model"})
        assert (answer.status_code, answer.json()["model"]) == (200, "engine-model")
        assert (
            httpx.post(f"{under_test.url}/v1/completions", json={"model": tokenizer.name, "prompt": "Hi"}).status_code
            == 404
        )
    with running_front(tokenizer, **{"front.model_name": "configured"}) as under_test:
        under_test.engine.served_model_name = "engine-model"
        time.sleep(0.3)
        assert httpx.get(f"{under_test.url}/v1/models").json()["data"][0]["id"] == "configured"
        assert httpx.get(f"{under_test.url}/v1/models/engine-model").status_code == 404


def test_the_engines_last_reject_wins_over_its_closed_connection(tokenizer: Any) -> None:
    """An engine on its way out (its vLLM engine core died) fails its requests and exits: the Rejects come on
    another connection than the one whose close tells the front the engine went away, in no fixed order with it.
    Here the connection closes first and the Reject follows 50 ms later: the client gets the engine's reason."""
    with running_front(tokenizer) as front:
        front.set_plan(lambda submit: [])  # submitted, no output: the request waits
        answer: list[httpx.Response] = []
        body = {"model": tokenizer.name, "prompt": "Hello", "max_tokens": 5, "stream": True}
        client = threading.Thread(
            target=lambda: answer.append(httpx.post(f"{front.url}/v1/completions", json=body, timeout=30))
        )
        client.start()
        submit = front.engine.submits.get(timeout=10)
        front.engine.__exit__(None, None, None)  # the engine's sockets close: the front sees its connection go
        time.sleep(0.05)
        with BusSockets(front.engine.config) as bus:
            push = bus.front_push()
            push.send(encode(Reject(submit.rid, "the vLLM engine core died: the request cannot finish")))
            client.join(timeout=30)
    assert answer, "no answer"
    assert "the vLLM engine core died" in answer[0].text, answer[0].text


@pytest.mark.parametrize("engine_failed", [True, None])
def test_an_engine_failure_is_answered_alike_whichever_of_its_reject_and_final_delta_comes_first(
    front: FrontUnderTest, engine_failed: bool | None
) -> None:
    """The engine fails a rid its worker has: the worker's final delta (engine_failed) and the engine's Reject race
    to the front on two connections; the client's status and error are the same either way. A final error delta of
    the worker's own (engine_failed None: a bad id) is the detokenizer's failure."""
    message = "the engine at grpc://10.0.0.9:50051 failed: UNAVAILABLE"

    def final_delta_only(submit: Submit) -> Any:
        return [TextDelta(submit.rid, 0, "", 0, finish="error", error=message, engine_failed=engine_failed)]

    def reject_only(submit: Submit) -> Any:
        front.engine.send_raw(encode(Reject(submit.rid, message)))
        return []

    answers = []
    for plan in (final_delta_only, reject_only):
        front.set_plan(plan)
        try:
            answers.append(httpx.post(f"{front.url}/v1/completions", json={"prompt": "Hi"}))
        finally:
            front.set_plan(front.echo_plan)
    by_delta, by_reject = (answer.json()["error"] for answer in answers)
    assert answers[1].status_code == 503 and message in by_reject["message"]
    if engine_failed:
        assert (answers[0].status_code, by_delta) == (503, by_reject)
    else:
        assert (answers[0].status_code, by_delta["code"], by_delta["message"]) == (502, "detokenizer_error", message)


def test_stats_read_after_the_engines_connection_closed_do_not_make_the_front_healthy(tokenizer: Any) -> None:
    """The engine's last EngineStats can be read after its connection closed (they come on another connection): the
    front stays unhealthy and refuses new requests (it would take them for a dead engine until its stats went stale),
    and takes a new engine as soon as it connects."""
    with front_config() as config, FrontServer(config, tokenizer) as server:
        dispatcher = server.front.dispatcher
        with PlayedEngine(config, plan=lambda submit: []) as first:
            under_test = FrontUnderTest(server, first, tokenizer)
            under_test.set_plan(under_test.echo_plan)
            under_test.wait_healthy()
            served = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi"})  # the front is connected
            assert served.status_code == 200, served.text
        wait_for(lambda: not dispatcher.healthy(), 10, 0.01, "the front to see the engine go")
        with BusSockets(config) as bus:  # the gone engine's last stats, read late
            bus.front_push().send(encode(EngineStats(0, {PLAYED_WORKER: 0}, {}, 0, 0)))
            time.sleep(0.3)
        assert not dispatcher.healthy()
        refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi"})
        assert (refused.status_code, refused.json()["error"]["type"]) == (503, "service_unavailable"), refused.text
        with PlayedEngine(config, plan=lambda submit: []) as second:
            FrontUnderTest(server, second, tokenizer).wait_healthy()


def test_an_engine_gone_fails_its_own_requests_not_those_a_new_engine_took_meanwhile(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's connection closes: the front fails its live requests after a short grace (frames it sent before
    it went may still arrive). A new engine that reports within that grace takes new requests: those stay."""
    monkeypatch.setattr(dispatch, "ENGINE_GONE_GRACE_S", 1.0)  # room for the new engine to report within it
    with front_config() as config, FrontServer(config, tokenizer) as server:
        dispatcher = server.front.dispatcher
        old_outcome: list[httpx.Response] = []
        with PlayedEngine(config, plan=lambda submit: []) as first:  # a request it never answers
            FrontUnderTest(server, first, tokenizer).wait_healthy()
            old = threading.Thread(
                target=lambda: old_outcome.append(httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi"})),
            )
            old.start()
            first.submits.get(timeout=5)
        wait_for(lambda: not dispatcher.healthy(), 10, 0.01, "the front to see the first engine go")  # the grace runs
        new_outcome: list[httpx.Response] = []
        text = "A request the new engine took while the old one's grace ran."
        with PlayedEngine(config, plan=lambda submit: []) as second:  # holds the new request until told
            under_test = FrontUnderTest(server, second, tokenizer)
            under_test.wait_healthy()
            body = {"prompt": text, "max_tokens": 50}
            new = threading.Thread(
                target=lambda: new_outcome.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=30)),
            )
            new.start()
            submit = second.submits.get(timeout=5)
            old.join(10)  # the grace is over: the old engine's request has failed
            assert not new_outcome, new_outcome[0].text
            for delta in under_test.echo_plan(submit):
                second.send_raw(encode(text_batch(PLAYED_WORKER, time.time_ns(), 0, [delta])))
            new.join(10)
    assert new_outcome and (new_outcome[0].status_code, new_outcome[0].json()["choices"][0]["text"]) == (200, text)
    assert old_outcome[0].status_code == 502 and old_outcome[0].json()["error"]["code"] == "engine_lost"
