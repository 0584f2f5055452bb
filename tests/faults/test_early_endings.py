"""Every way a request ends early frees its state in the front, the engine and the worker within 1 s, through a
real `detok serve --source echo` with a slow engine (10 ms per step: a long echo would run for many seconds).

Covered here: a non-streaming client that disconnects, the request timeout (front.request_timeout_s) for a
streaming and a non-streaming request, and max_tokens. A streaming client that disconnects and a stop string are
in tests/e2e/test_stop_and_disconnect.py; an engine-side error and bad parameters in tests/faults/test_params.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.fault_helpers import all_idle, complete, http_client, stream_completion
from helpers.serve_helpers import ServeProcess, serving, wait_for

STEP_MS = 10
STATS_INTERVAL_S = 0.05
FREED_WITHIN_S = 1.0 + STATS_INTERVAL_S  # the 1 s requirement + the reporting lag of /stats
REQUEST_TIMEOUT_S = 1.5
LONG_PROMPT = "Tell me a long story." + " filler" * 1500  # ~1500 tokens: 15 s of generation


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving(
        "--workers", "2", "--source", "echo", "--step-interval-ms", str(STEP_MS),
        "--set", f"front.request_timeout_s={REQUEST_TIMEOUT_S}", "--set", "front.max_tokens_limit=4000",
        "--set", f"worker.stats_interval_s={STATS_INTERVAL_S}", "--set", f"engine.stats_interval_s={STATS_INTERVAL_S}",
    ) as serve:  # fmt: skip
        yield serve


def assert_freed_within(service: ServeProcess, since: float, what: str) -> None:
    wait_for(lambda: all_idle(service), since + FREED_WITHIN_S - time.monotonic(), what=f"live rids 0 after {what}")


def test_non_streaming_client_disconnect(service: ServeProcess) -> None:
    aborted = service.stats()["engine"]["aborted"]
    body = {"prompt": LONG_PROMPT, "max_tokens": 4000}
    with httpx.Client(base_url=service.url) as client:
        request = client.build_request("POST", "/v1/completions", json=body, timeout=0.8)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            client.send(request)
        left_at = time.monotonic()
    assert_freed_within(service, left_at, "the client left")
    assert service.stats()["engine"]["aborted"] == aborted + 1


@pytest.mark.parametrize("stream", [False, True])
def test_request_timeout(service: ServeProcess, stream: bool) -> None:
    aborted = service.stats()["engine"]["aborted"]

    async def run() -> Any:
        async with http_client(service, connections=1) as client:
            request = (stream_completion if stream else complete)(client, {"prompt": LONG_PROMPT, "max_tokens": 4000})
            return await asyncio.wait_for(request, REQUEST_TIMEOUT_S + 10)

    started = time.monotonic()
    outcome = asyncio.run(run())
    ended_at = time.monotonic()
    assert ended_at - started >= REQUEST_TIMEOUT_S
    assert outcome.error is not None and outcome.error["code"] == "timeout", outcome
    if stream:
        assert outcome.status == 200 and outcome.text.startswith("Tell me a long story.")  # then the error event
    else:
        assert outcome.status == 504
    assert_freed_within(service, ended_at, "the timeout")
    assert service.stats()["engine"]["aborted"] == aborted + 1


def test_max_tokens_ends_the_request_everywhere(service: ServeProcess) -> None:
    async def run() -> Any:
        async with http_client(service, connections=1) as client:
            return await stream_completion(client, {"prompt": LONG_PROMPT, "max_tokens": 7})

    outcome = asyncio.run(asyncio.wait_for(run(), 30))
    ended_at = time.monotonic()
    assert (outcome.status, outcome.finish_reason, outcome.error) == (200, "length", None)
    assert LONG_PROMPT.startswith(outcome.text) and outcome.text
    assert_freed_within(service, ended_at, "max_tokens")


def test_mixed_endings_under_load_leave_nothing_live(service: ServeProcess) -> None:
    """Many requests at once, ending every way (length, EOS, stop string, disconnect): all counts return to 0."""

    async def leave_early(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/completions", json={"prompt": LONG_PROMPT, "stream": True}) as reply:
            async for line in reply.aiter_lines():
                if "filler" in line:
                    return

    async def run() -> None:
        async with http_client(service) as client:
            jobs = []
            for index in range(40):
                kind = index % 4
                if kind == 0:
                    jobs.append(leave_early(client))
                else:
                    prompt = f"{index} short prompt, stop here please" if kind < 3 else LONG_PROMPT
                    body = {"prompt": prompt, "max_tokens": 12 if kind == 3 else 50}
                    if kind == 2:
                        body["stop"] = [" here"]
                    jobs.append(stream_completion(client, body))
            await asyncio.wait_for(asyncio.gather(*jobs), 60)

    asyncio.run(run())
    wait_for(lambda: all_idle(service), 3, what="live rids 0 everywhere after the mixed load")
