"""Graceful drain and engine loss, with real processes.

- SIGTERM to `detok serve` under live streams: new requests get 503 + Retry-After and /health says "draining";
  streams that end within front.drain_timeout_s are exact and end with [DONE]; the others get a `shutdown`
  error event and [DONE]; the service exits 0 with no traceback in its log.
- Procfile mode (front, engine, two workers started one by one): kill -9 the engine mid-stream: every stream
  gets an `engine_lost` error event within 2 s; a new engine: the same workers (same pids) register again and a
  new request is exact. Then SIGTERM to the front alone lets its live stream finish.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.bus_peers import short_runtime_dir
from helpers.fault_helpers import (
    EchoCase,
    Outcome,
    bounded,
    echo_service,
    http_client,
    reference,
    stream_completion,
)
from helpers.front_harness import free_port
from helpers.role_process import RoleProcess, stopping
from helpers.serve_helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families

STEP_MS = 20
DRAIN_S = 5.0
STATS = ["--set", "worker.stats_interval_s=0.1", "--set", "engine.stats_interval_s=0.1"]
ENGINE_ARGS = ["--source", "echo", "--step-interval-ms", str(STEP_MS), "--set", "engine.stats_interval_s=0.1"]


def passage_ids(tokenizer: Any, tokens: int, seed: int) -> list[int]:
    """`tokens` ids of plain text (a different start per seed), so the echo source generates them back."""
    text = " ".join(f"Line {seed}.{i}: the keeper wrote down the wind and the colour of the sea." for i in range(400))
    return tokenizer.encode(text).ids[:tokens]


def draining_gauge(metrics_text: str) -> float:
    """detok_front_draining in a /metrics page."""
    family = next(f for f in text_string_to_metric_families(metrics_text) if f.name == "detok_front_draining")
    return family.samples[0].value


def check_cut_short(outcome: Outcome, expected: str, code: str) -> None:
    assert outcome.status == 200 and outcome.done, outcome
    assert outcome.error is not None and outcome.error["code"] == code, outcome
    assert expected.startswith(outcome.text) and len(outcome.text) < len(expected)


def check_exact(outcome: Outcome, expected: str) -> None:
    assert outcome.status == 200 and outcome.done and outcome.error is None, outcome
    assert (outcome.text, outcome.finish_reason) == (expected, "stop")


async def sigterm_under_live_streams(tokenizer: Any, streams: int) -> None:
    # short ones end in ~40 steps (< 1 s), long ones need 600 steps (12 s): past the 5 s drain
    cases = [
        EchoCase(passage_ids(tokenizer, 40 if i % 2 else 600, i), [], 1000) for i in range(streams)
    ]  # fmt: skip
    with echo_service(2, STEP_MS, "--set", f"front.drain_timeout_s={DRAIN_S}") as service:
        async with http_client(service, 400) as client:
            tasks = [asyncio.create_task(bounded(stream_completion(client, case.body(True)))) for case in cases]
            await asyncio.to_thread(
                wait_for, lambda: service.stats()["front"]["live_rids"] == streams, 60, what="every stream live"
            )
            serving_gauge = draining_gauge((await client.get("/metrics")).text)
            service.proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(wait_for, lambda: service.health() == 503, 5, what="/health not ready")
            refused = await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 5})
            health = (await client.get("/health")).json()
            drain_gauge = draining_gauge((await client.get("/metrics")).text)
            outcomes = await asyncio.gather(*tasks)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["code"] == "shutdown"
        assert health["status"] == "draining"
        assert (serving_gauge, drain_gauge) == (0.0, 1.0)
        for case, outcome in zip(cases, outcomes, strict=True):
            expected, _ = reference(tokenizer, case)
            if len(case.ids) == 40:
                check_exact(outcome, expected)
            else:
                check_cut_short(outcome, expected, "shutdown")
        assert service.proc.wait(30) == 0
        log = service.log(None)
        assert "Traceback" not in log and "drain timeout: " in log


def test_sigterm_drains_live_streams(tokenizer: Any) -> None:
    asyncio.run(sigterm_under_live_streams(tokenizer, 30))


@pytest.mark.slow
def test_sigterm_drains_100_live_streams(tokenizer: Any) -> None:
    asyncio.run(sigterm_under_live_streams(tokenizer, 100))


@pytest.fixture
def procfile() -> Iterator[dict[str, Any]]:
    with short_runtime_dir("dtd-") as runtime_dir:
        port = free_port()
        started = {
            "front": RoleProcess(
                runtime_dir, "front", "--set", f"front.port={port}", "--set", "front.drain_timeout_s=20"
            ),
            "worker-a": RoleProcess(runtime_dir, "worker", "--id", "wa", *STATS, log_name="worker-a"),
            "worker-b": RoleProcess(runtime_dir, "worker", "--id", "wb", *STATS, log_name="worker-b"),
            "engine": RoleProcess(runtime_dir, "engine", *ENGINE_ARGS),
        }
        url = f"http://127.0.0.1:{port}"
        with stopping(started):
            wait_for(lambda: health(url)[1].get("workers") == 2, 60, what="the front to see the engine and two workers")
            yield {"url": url, "runtime_dir": runtime_dir, "processes": started}


def health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        response = httpx.get(f"{url}/health", timeout=2)
        return response.status_code, response.json()
    except httpx.HTTPError:
        return 0, {}


async def kill_engine_mid_stream(url: str, engine: RoleProcess, cases: list[EchoCase]) -> tuple[list[Outcome], float]:
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=100)) as client:
        tasks = [asyncio.create_task(bounded(stream_completion(client, case.body(True)))) for case in cases]

        def all_live() -> bool:
            stats = httpx.get(f"{url}/stats", timeout=5).json()
            if stats["engine"] is None or stats["engine"]["live_rids"] != len(cases):
                return False
            # and each worker holds some (on a loaded machine their Opens may not have reached one yet): a worker
            # that holds none when the new engine comes is simply registered again, with no rejoin to log
            workers = stats["workers"]
            return all(workers.get(worker, {}).get("live_rids", 0) > 0 for worker in ("wa", "wb"))

        await asyncio.to_thread(wait_for, all_live, 60, what="every stream live in the engine, some on each worker")
        engine.proc.kill()
        killed_at = time.monotonic()
        return list(await asyncio.gather(*tasks)), killed_at


def test_engine_loss_and_a_new_engine_in_procfile_mode(tokenizer: Any, procfile: dict[str, Any]) -> None:
    url, processes = procfile["url"], procfile["processes"]
    worker_pids = {name: processes[name].proc.pid for name in ("worker-a", "worker-b")}
    cases = [EchoCase(passage_ids(tokenizer, 600, i), [], 1000) for i in range(20)]
    outcomes, killed_at = asyncio.run(kill_engine_mid_stream(url, processes["engine"], cases))
    for case, outcome in zip(cases, outcomes, strict=True):
        check_cut_short(outcome, reference(tokenizer, case)[0], "engine_lost")
        assert outcome.error_at is not None and outcome.error_at - killed_at < 2.0
    status, body = health(url)
    assert status == 503 and body["engine"] is False

    processes["engine"] = RoleProcess(procfile["runtime_dir"], "engine", *ENGINE_ARGS, log_name="engine-2")
    wait_for(lambda: health(url)[1].get("workers") == 2, 60, what="both workers registered with the new engine")
    case = EchoCase(passage_ids(tokenizer, 60, 99), [], 1000)
    outcome = asyncio.run(stream_once(url, case))
    check_exact(outcome, reference(tokenizer, case)[0])
    for name, pid in worker_pids.items():
        assert processes[name].proc.poll() is None and processes[name].proc.pid == pid
        assert "the engine asked to rejoin" in processes[name].log()

    # SIGTERM to the front alone: its live stream still ends exactly
    long_case = EchoCase(passage_ids(tokenizer, 100, 7), [], 1000)  # ~2 s of steps, inside the 20 s drain
    outcome = asyncio.run(stream_during_front_sigterm(url, processes["front"], long_case))
    check_exact(outcome, reference(tokenizer, long_case)[0])
    assert processes["front"].proc.wait(30) == 0
    for process in processes.values():
        assert "Traceback" not in process.log()


async def stream_once(url: str, case: EchoCase) -> Outcome:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return await bounded(stream_completion(client, case.body(True)))


async def stream_during_front_sigterm(url: str, front: RoleProcess, case: EchoCase) -> Outcome:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        task = asyncio.create_task(bounded(stream_completion(client, case.body(True))))
        await asyncio.to_thread(
            wait_for, lambda: health(url)[1].get("live_rids") == 1, 30, what="the stream live at the front"
        )
        front.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(wait_for, lambda: health(url)[0] == 503, 5, what="the front draining")
        return await task
