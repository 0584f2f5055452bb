"""The front's global output budget (front.max_total_pending_chars), through a real `detok serve --source echo`:
clients that stop reading answers that have finished leave their text in the front; once that passes the budget
the next request is refused with a 503 `front_overloaded` and the streams holding more than their share are cut
(their clients get a `client_too_slow` error event and [DONE] when they read again), so the request after it is
served; when the stalled clients go away the front holds nothing.

Each stalled answer is ~5.7 M characters, below the budget (so one alone is never cut) and well above what the
kernel's socket buffers absorb (up to ~4 MB on loopback), so a few of them pass the budget."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from helpers.fault_helpers import echo_service, read_sse_events, stalled_stream
from helpers.serve_helpers import ServeProcess, wait_for

BUDGET_CHARS = 6_000_000
LONG_TOKEN = 89180  # qwen3: "//" + 112 dashes, 114 characters
STALLED_TOKENS = 50_000  # 5.7 M characters per stalled answer
MAX_STALLED_CLIENTS = 5


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(
        1, 1, "--tokens-per-step", "64",
        "--set", f"front.max_total_pending_chars={BUDGET_CHARS}",
        "--set", "front.max_pending_chars=8000000",  # above one answer: only the global budget applies
        "--set", "front.max_tokens_limit=200000", "--set", "front.max_prompt_tokens=1048576",
    ) as serve:  # fmt: skip
        yield serve


def ended_requests(service: ServeProcess) -> int:
    front = service.stats()["front"]
    return int(front.get("completed", 0) + front.get("client_too_slow", 0) + front.get("failed", 0))


def test_stalled_clients_past_the_budget_get_new_requests_refused_then_cut(service: ServeProcess) -> None:
    url = service.url
    body = {"prompt": [LONG_TOKEN] * STALLED_TOKENS, "max_tokens": STALLED_TOKENS + 1, "stream": True}
    stalled: list[socket.socket] = []
    try:
        while service.stats()["front"]["pending_chars"] <= BUDGET_CHARS:
            assert len(stalled) < MAX_STALLED_CLIENTS, f"the front buffered {service.stats()['front']}"
            expected = ended_requests(service) + 1
            stalled.append(stalled_stream(service, body))
            wait_for(lambda n=expected: ended_requests(service) == n, 60, what="the stalled client's answer to end")
            assert service.stats()["front"].get("client_too_slow", 0) == 0  # one answer alone is within budget
        print(f"{len(stalled)} stalled clients; front holds {service.stats()['front']['pending_chars']} characters")

        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello there", "max_tokens": 8}, timeout=30)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "front_overloaded"
        front = service.stats()["front"]
        assert front["overloaded"] == 1
        assert front["client_too_slow"] >= 1  # at least one of them held more than its share, and was cut
        assert front["pending_chars"] <= BUDGET_CHARS
        served = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello there", "max_tokens": 8}, timeout=30)
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["text"] == "Hello there"

        cut = 0
        for raw in stalled:  # they read again: every stream ends with [DONE], a cut one after its error event
            events = read_sse_events(raw)
            assert events[-1] == b"[DONE]"
            last = json.loads(events[-2])
            if "error" in last:
                assert last["error"]["code"] == "client_too_slow"
                cut += 1
            else:
                assert last["choices"][0]["finish_reason"] == "stop"
        assert cut == front["client_too_slow"]
    finally:
        for raw in stalled:
            raw.close()
    wait_for(lambda: service.stats()["front"]["pending_chars"] == 0, 10, what="the front to hold no text")
    assert service.stats()["front"]["live_rids"] == 0
