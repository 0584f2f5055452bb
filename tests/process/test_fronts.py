"""`detok serve --fronts 2`: two front processes on one port (SO_REUSEPORT), each with its own bus PULL, over the
echo source (every expected text is computable from the tokenizer alone).

- 200 concurrent streams are exact, both fronts served some (the access log names the front of each line), and
  /metrics counts the responses of both.
- SIGKILL of one front under streaming load: its own clients get a connection error (no hang), every stream on
  the other front finishes exact, and the supervisor restarts the front at its index, which serves again."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from helpers.fault_helpers import (
    REQUEST_TIMEOUT_S,
    EchoCase,
    all_idle,
    echo_cases,
    echo_service,
    http_client,
    reference,
)
from helpers.metrics_scrape import wait_for_value
from helpers.serve_helpers import ServeProcess, wait_for

STEP_MS = 4
ACCESS_LINE = re.compile(r"front(?::\d+)?\[(\d+)\] detok\.access: .*?rid=(\S+) method=POST path=/v1/completions")


@dataclass
class StreamOutcome:
    rid: str | None = None  # the `id` of the stream's events (the bus rid)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None  # an error event, or the connection error the client saw


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(2, STEP_MS, "--fronts", "2") as serve:
        yield serve


def front_pids(service: ServeProcess) -> dict[int, int]:
    """Front index -> pid, from the front processes' command lines."""
    pids = {}
    for pid in service.child_pids("front"):
        cmdline = service.children()[pid]
        index = int(cmdline.split("--index")[1].split()[0]) if "--index" in cmdline else 0
        pids[index] = pid
    return pids


def served_by(service: ServeProcess) -> dict[str, int]:
    """Bus rid -> pid of the front that logged the request (access log lines of /v1/completions)."""
    return {rid: int(pid) for pid, rid in ACCESS_LINE.findall(service.log(tail=None))}


async def stream(client: httpx.AsyncClient, case: EchoCase, started: list[int]) -> StreamOutcome:
    outcome = StreamOutcome()
    parts: list[str] = []
    try:
        async with client.stream("POST", "/v1/completions", json=case.body(True)) as response:
            if response.status_code != 200:
                return StreamOutcome(error=f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    outcome.error = str(event["error"])
                    continue
                if outcome.rid is None:
                    outcome.rid = event["id"]
                    started.append(1)
                for choice in event["choices"]:
                    parts.append(choice["text"])
                    outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
    except httpx.TransportError as exc:  # the front died under this stream
        outcome.error = f"connection: {type(exc).__name__}"
    outcome.text = "".join(parts)
    return outcome


async def run_streams(
    service: ServeProcess, cases: list[EchoCase], kill_pid: int | None = None, kill_after_started: int = 0
) -> list[StreamOutcome]:
    """Every case as a concurrent stream, each on its own connection; SIGKILL `kill_pid` once
    `kill_after_started` streams have their first event."""
    started: list[int] = []

    async def killer() -> None:
        while len(started) < kill_after_started:
            await asyncio.sleep(0.01)
        os.kill(kill_pid, signal.SIGKILL)  # type: ignore[arg-type]

    async with http_client(service, connections=len(cases)) as client:
        kill = asyncio.create_task(killer()) if kill_pid is not None else None
        requests = (asyncio.wait_for(stream(client, case, started), REQUEST_TIMEOUT_S) for case in cases)
        outcomes = await asyncio.gather(*requests)
        if kill is not None:
            await kill
    return list(outcomes)


def exact(tokenizer: Any, case: EchoCase, outcome: StreamOutcome) -> bool:
    return (outcome.error, outcome.text, outcome.finish_reason) == (None, *reference(tokenizer, case))


def test_two_fronts_serve_200_concurrent_streams_exactly(service: ServeProcess, tokenizer: Any) -> None:
    cases = echo_cases(tokenizer, 200, seed=21)
    outcomes = asyncio.run(run_streams(service, cases))
    wrong = [(i, o) for i, (c, o) in enumerate(zip(cases, outcomes, strict=True)) if not exact(tokenizer, c, o)]
    assert not wrong, f"{len(wrong)} of 200 streams differ; first: {wrong[0]}"
    pids = front_pids(service)
    assert len(pids) == 2
    served = wait_for(
        lambda: (lines := served_by(service)) and all(o.rid in lines for o in outcomes) and lines,
        10,
        what="an access line for every stream",
    )
    per_front = {pid: sum(served[o.rid] == pid for o in outcomes) for pid in pids.values()}
    assert all(count > 0 for count in per_front.values()), per_front
    assert sum(per_front.values()) == 200
    # /metrics, from whichever front answers, counts the responses of both (a fresh service: exactly these 200)
    wait_for_value(service.url, "detok_http_responses_total", 200, endpoint="/v1/completions", status="200")
    wait_for(lambda: all_idle(service), 10, what="live rids 0 everywhere")
    # /stats, from whichever front answers, lists both and sums their requests (each front's section is shared
    # at its sweep, so wait for the other's)
    stats = wait_for(
        lambda: (got := service.stats())["front_totals"]["completed"] == 200 and got, 10, what="/stats of both fronts"
    )
    assert sorted(front["pid"] for front in stats["fronts"]) == sorted(pids.values())
    assert stats["front_totals"]["processes"] == 2
    assert {front["index"]: front["completed"] for front in stats["fronts"]} == {
        index: per_front[pid] for index, pid in pids.items()
    }


def test_sigkill_of_one_front_loses_only_its_own_streams(service: ServeProcess, tokenizer: Any) -> None:
    before = front_pids(service)
    victim, survivor = before[1], before[0]
    # long streams (800+ tokens, few stop strings: 3.2 s and more at 4 ms a step) and the kill at the 20th first
    # event, so that many are live at the kill even when this client reads slower than the fronts write
    cases = echo_cases(tokenizer, 200, seed=22, min_tokens=800, stop_share=0.2)
    outcomes = asyncio.run(run_streams(service, cases, kill_pid=victim, kill_after_started=20))
    wait_for(lambda: all_idle(service), 20, what="live rids 0 everywhere after the kill")  # every access line is out
    served = served_by(service)
    on_survivor = [(c, o) for c, o in zip(cases, outcomes, strict=True) if served.get(o.rid or "") == survivor]
    cut = [o for o in outcomes if o.error is not None]
    assert on_survivor, "no stream was served by the surviving front"
    wrong = [(c, o) for c, o in on_survivor if not exact(tokenizer, c, o)]
    assert not wrong, f"{len(wrong)} of {len(on_survivor)} streams on the surviving front differ; first: {wrong[0]}"
    assert cut, "the kill cut no stream (every stream had ended?)"
    assert all(o.error.startswith("connection:") for o in cut), cut[:3]  # type: ignore[union-attr]
    assert not any(served.get(o.rid or "") == survivor for o in cut)
    # every stream is either cut by the kill or exact: none hangs (wait_for above each) and none is garbled
    for case, outcome in zip(cases, outcomes, strict=True):
        assert outcome.error is not None or exact(tokenizer, case, outcome), outcome

    # the supervisor restarts the front at index 1; new connections reach it and it serves generations exactly
    restarted = wait_for(
        lambda: (p := front_pids(service)).get(1) not in (None, victim) and p.get(0) == survivor and p[1],
        20,
        what="a new front process at index 1",
    )
    assert "front 1 (pid" in service.log(tail=None) and "restarting" in service.log(tail=None)
    probe = echo_cases(tokenizer, 40, seed=23)

    def served_by_new_front() -> bool:
        outcomes = asyncio.run(run_streams(service, probe))
        assert all(exact(tokenizer, c, o) for c, o in zip(probe, outcomes, strict=True))
        served = served_by(service)
        return any(served.get(o.rid or "") == restarted for o in outcomes)

    wait_for(served_by_new_front, 60, interval=0.5, what="a stream served by the restarted front")
    wait_for(lambda: all_idle(service), 20, what="live rids 0 everywhere after the kill")
