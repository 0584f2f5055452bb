"""Memory stays bounded, through a real `detok serve --source echo` with a flat-out engine:

- a client that stops reading its stream: the front keeps at most front.max_pending_chars for it, then the
  request ends with an error event and the engine stops generating it (live rids back to 0 everywhere), while
  the front's RSS does not grow with the request's output;
- leak test: thousands of short requests (streaming and not), then live rid counts are 0 in the front, the
  engine and every worker, and no process grew its RSS by more than a few MB after warm-up.

Default suite: 2,000 requests; `-m slow`: 20,000."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.fault_helpers import (
    EchoCase,
    all_idle,
    bounded,
    complete,
    echo_service,
    http_client,
    live_counts,
    read_sse_events,
    reference,
    rss_kb,
    service_pids,
    stalled_stream,
    stream_completion,
)
from helpers.serve_helpers import ServeProcess, wait_for

from engine_stub.planned import load_corpus

MAX_PENDING_CHARS = 100_000
LONG_TOKEN = 89180  # qwen3: "//" + 112 dashes, 114 characters
FLOOD_TOKENS = 150_000  # ~17 M characters if nobody stopped it
RSS_GROWTH_LIMIT_KB = 30 * 1024
CONCURRENCY = 32


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(
        2, 1, "--tokens-per-step", "16",
        "--set", f"front.max_pending_chars={MAX_PENDING_CHARS}", "--set", "front.max_tokens_limit=200000",
        "--set", "front.max_prompt_tokens=1048576",  # the flood's prompt is longer than Qwen3's context
    ) as serve:  # fmt: skip
        yield serve


def test_stalled_client_is_cut_off_and_generation_stops(service: ServeProcess) -> None:
    front_pid = service_pids(service)["front"]
    rss_before = rss_kb(front_pid)
    before = service.stats()
    tokens_before = sum(worker["tokens_in"] for worker in before["workers"].values())
    body = {"prompt": [LONG_TOKEN] * FLOOD_TOKENS, "max_tokens": FLOOD_TOKENS + 1, "stream": True}
    with stalled_stream(service, body) as raw:
        wait_for(lambda: service.stats()["front"].get("client_too_slow", 0) == 1, 60, what="the front to give up")
        wait_for(lambda: all_idle(service), 2, what="live rids 0 everywhere after the cut")
        stats = service.stats()
        assert stats["engine"]["aborted"] == before["engine"]["aborted"] + 1
        generated = sum(worker["tokens_in"] for worker in stats["workers"].values()) - tokens_before
        assert generated < FLOOD_TOKENS // 2, "the engine kept generating for a client that was gone"
        # what the front held for this client is bounded by max_pending_chars (plus socket buffers), not by the
        # output: it would have been ~17 MB of text (~50 MB of SSE)
        front_growth = rss_kb(front_pid) - rss_before
        print(f"stalled client: cut off after {generated} tokens; front RSS growth {front_growth} KiB")
        assert front_growth < RSS_GROWTH_LIMIT_KB

        events = read_sse_events(raw)  # the client reads again: the stream ends with the error event and [DONE]
    assert events[-1] == b"[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "client_too_slow"


def short_cases(tokenizer: Any, count: int, seed: int) -> list[tuple[EchoCase, bool, str]]:
    """Short text prompts (encoded by the front), some with stop strings, a quarter streaming."""
    rng = random.Random(seed)
    passages = load_corpus()
    cases = []
    for index in range(count):
        passage = rng.choice(passages)
        start = rng.randrange(len(passage) // 2)
        text = f"{index}: {passage[start : start + rng.randint(10, 60)]}"
        ids = tokenizer.encode(text, add_special_tokens=True).ids
        stop = [text[-3:-1]] if rng.random() < 0.3 and text[-3:-1].strip() else []
        cases.append((EchoCase(ids, stop, rng.randint(4, 40)), index % 4 == 0, text))
    return cases


async def run_short_requests(service: ServeProcess, cases: list[Any]) -> list[Any]:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(cases)):
        queue.put_nowait(index)
    outcomes: list[Any] = [None] * len(cases)

    async def client_loop(client: Any) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            case, stream, text = cases[index]
            body = {**case.body(stream), "prompt": text}
            run = stream_completion if stream else complete
            outcomes[index] = await bounded(run(client, body))

    async with http_client(service, connections=CONCURRENCY) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(CONCURRENCY)))
    return outcomes


def leak_round(service: ServeProcess, tokenizer: Any, requests: int) -> None:
    pids = service_pids(service)
    warm_up = short_cases(tokenizer, 400, seed=1)
    asyncio.run(run_short_requests(service, warm_up))
    wait_for(lambda: all_idle(service), 10, what="idle after the warm-up")
    rss_before = {role: rss_kb(pid) for role, pid in pids.items()}

    cases = short_cases(tokenizer, requests, seed=2)
    started = time.monotonic()
    outcomes = asyncio.run(run_short_requests(service, cases))
    elapsed = time.monotonic() - started
    wrong = [
        (case, outcome)
        for (case, _, _), outcome in zip(cases, outcomes, strict=True)
        if (outcome.status, outcome.text, outcome.finish_reason) != (200, *reference(tokenizer, case))
    ]
    assert not wrong, f"{len(wrong)} of {len(cases)} requests differ; first: {wrong[0]}"

    wait_for(lambda: all_idle(service), 5, what="live rids 0 in front, engine and workers")
    assert service_pids(service) == pids  # nothing died or restarted
    rss_after = {role: rss_kb(pid) for role, pid in pids.items()}
    growth = {role: rss_after[role] - rss_before[role] for role in pids}
    print(f"{requests} requests in {elapsed:.1f} s; RSS growth KiB: {growth}; live: {live_counts(service)}")
    assert all(kib < RSS_GROWTH_LIMIT_KB for kib in growth.values()), growth


def test_many_short_requests_leave_no_state_and_no_growth(service: ServeProcess, tokenizer: Any) -> None:
    leak_round(service, tokenizer, requests=2_000)


@pytest.mark.slow
def test_twenty_thousand_short_requests_leave_no_state_and_no_growth(service: ServeProcess, tokenizer: Any) -> None:
    leak_round(service, tokenizer, requests=20_000)
