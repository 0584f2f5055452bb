"""engine_stub's model-free vLLM worker (`--worker-cls`): vLLM's own engine core, scheduler and wire with seeded ids
and a fixed step time. `vllm serve` runs it on one engine core; `detok serve --source vllm` on the same flags runs it
data parallel on two (`--data-parallel-size 2`: vLLM's own DP client, coordinator and load balancing), on one host,
and on two: the second engine core a `vllm serve --headless` in a network namespace of its own joined to this one by
a veth pair (vLLM's multi-node route: `--data-parallel-address`, `--data-parallel-rpc-port`; root only). A request's
ids depend on the request alone, so both servers must give every request the same ids and texts: the checks that
the worker's outputs look like a real engine's to both, and that detok serves through two engine cores."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fault_helpers import Outcome, bounded, http_client, stream_completion
from helpers.metrics_scrape import Samples, scrape, total
from helpers.serve_helpers import REPO, ServeProcess, children_of, pid_alive, wait_for
from helpers.tokenizer_files import reference_hf_tokenizer
from helpers.vllm_cpu import (
    ENGINE_FLAGS,
    ENV,
    MODEL_FREE_STEP_ENV,
    MODEL_FREE_WORKER,
    SERVED_NAME,
    VENV,
    VllmServer,
    detok_vllm,
    model_dir,
    vllm_server,
)

pytestmark = pytest.mark.timeout(900)

STEP_MS = 15  # a GPU decode step
MODEL_FREE = ("--worker-cls", MODEL_FREE_WORKER)
MODEL_FREE_ENV = {MODEL_FREE_STEP_ENV: str(STEP_MS), "PYTHONPATH": str(REPO)}
DATA_PARALLEL = ("--data-parallel-size", "2")
TWO_FRONTS = ("--api-server-count", "2")  # on one host


@pytest.fixture(scope="module")
def qwen3() -> Any:
    return reference_hf_tokenizer("qwen3")


@pytest.fixture(scope="module")
def reference() -> Iterator[VllmServer]:
    with vllm_server(*MODEL_FREE, env=MODEL_FREE_ENV) as server:
        yield server


class SecondHost:
    """A network namespace joined to this one by a veth pair: another host for the engine cores (`ip`, as root).
    `head` is this host's address on the link, `address` the other's."""

    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.namespace, self.link = f"detok-host-{tag}", f"dtk{tag}"
        subnet = f"10.77.{tag % 250}"
        self.head, self.address = f"{subnet}.1", f"{subnet}.2"
        netns = ["ip", "netns", "exec", self.namespace, "ip"]
        for command in (
            ["ip", "netns", "add", self.namespace],
            ["ip", "link", "add", f"{self.link}a", "type", "veth", "peer", "name", f"{self.link}b"],
            ["ip", "link", "set", f"{self.link}b", "netns", self.namespace],
            ["ip", "addr", "add", f"{self.head}/24", "dev", f"{self.link}a"],
            ["ip", "link", "set", f"{self.link}a", "up"],
            [*netns, "addr", "add", f"{self.address}/24", "dev", f"{self.link}b"],
            [*netns, "link", "set", f"{self.link}b", "up"],
            [*netns, "link", "set", "lo", "up"],
        ):
            subprocess.run(command, check=True, capture_output=True)

    def run(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.namespace, *argv], env=dict(os.environ, **env), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def remove(self) -> None:
        for pid in subprocess.run(
            ["ip", "netns", "pids", self.namespace], capture_output=True, text=True
        ).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{self.link}a"], capture_output=True)


class DataParallelService:
    """detok serve on two engine cores: both its own children (one host), or the second a headless `vllm serve`
    on a SecondHost."""

    def __init__(self, hosts: int) -> None:
        self.second_host = SecondHost() if hosts == 2 else None
        self.headless: subprocess.Popen[bytes] | None = None
        self.running = contextlib.ExitStack()  # closed: detok serve stops, then the second host goes
        self.running.callback(self.stop_headless)
        flags = (*MODEL_FREE, *DATA_PARALLEL, *(TWO_FRONTS if hosts == 1 else ()))
        try:
            if self.second_host is not None:
                rpc_port = 20000 + os.getpid() % 20000
                flags += ("--data-parallel-size-local", "1", "--data-parallel-address", self.second_host.head,
                          "--data-parallel-rpc-port", str(rpc_port))  # fmt: skip
                log = Path(tempfile.mkstemp(prefix="vllm-headless-", suffix=".log")[1])
                argv = [str(VENV / "bin" / "vllm"), "serve", str(model_dir()), *ENGINE_FLAGS, *flags, "--headless",
                        "--data-parallel-start-rank", "1"]  # fmt: skip
                self.headless = self.second_host.run(argv, {**ENV, **MODEL_FREE_ENV}, log)
            self.serve = self.running.enter_context(detok_vllm(engine_flags=flags, env=MODEL_FREE_ENV))
        except BaseException:
            self.running.close()
            raise

    def core_pid(self, rank: int) -> int:
        """The pid of the engine core of one data parallel rank: under detok's engine process, or the headless
        server's on the second host."""
        parents = self.serve.child_pids("engine") if self.headless is None else [self.headless.pid]
        if self.headless is not None:
            parents += [pid for parent in parents for pid in children_of(parent)]
        for parent in parents:
            for pid, cmdline in children_of(parent).items():
                if f"EngineCore_DP{rank}" in cmdline:
                    return pid
        raise AssertionError(f"no EngineCore_DP{rank} under {parents}")

    def stop_headless(self) -> None:
        if self.second_host is not None:
            self.second_host.remove()

    def stop(self) -> None:
        self.running.close()


@pytest.fixture(scope="module", params=[1, 2], ids=["one-host", "two-hosts"])
def data_parallel(request: pytest.FixtureRequest) -> Iterator[DataParallelService]:
    running = DataParallelService(request.param)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def service(data_parallel: DataParallelService) -> ServeProcess:
    return data_parallel.serve


def seeded(seed: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED_NAME, "prompt": f"Story number {seed}:", "max_tokens": max_tokens, "seed": seed, **extra}


async def stream_all(server: ServeProcess | VllmServer, bodies: list[dict[str, Any]]) -> list[Outcome]:
    async with http_client(server, connections=len(bodies)) as client:  # type: ignore[arg-type]
        return await asyncio.gather(*(bounded(stream_completion(client, body), 120) for body in bodies))


def metric_by_engine(service: ServeProcess, name: str) -> dict[str, float]:
    """A vllm:* family's value per engine core (its `engine` label) from detok's /metrics."""
    text = httpx.get(f"{service.url}/metrics", timeout=10).text
    pattern = re.compile(rf'^{re.escape(name)}\{{[^}}]*engine="(\d+)"[^}}]*\}} (\S+)$', re.MULTILINE)
    values: dict[str, float] = {}
    for engine, value in pattern.findall(text):
        values[engine] = values.get(engine, 0.0) + float(value)
    return values


def test_both_servers_give_every_request_the_same_ids_and_detok_the_exact_text_through_two_engine_cores(
    reference: VllmServer, service: ServeProcess, qwen3: Any
) -> None:
    """100 seeded streams at once to each server: the same ids from vLLM's single engine core and from detok's two;
    detok's text is the full decode of its ids (vLLM's server drops a character the last id leaves unfinished,
    so its text may lack that end), and both cores generated some of them."""
    before = metric_by_engine(service, "vllm:generation_tokens_total")
    bodies = [seeded(seed, 48, return_token_ids=True) for seed in range(1, 101)]
    theirs = asyncio.run(stream_all(reference, bodies))
    ours = asyncio.run(stream_all(service, bodies))
    for body, vllm_outcome, outcome in zip(bodies, theirs, ours, strict=True):
        assert vllm_outcome.error is None and outcome.error is None and outcome.done, (body, vllm_outcome, outcome)
        assert outcome.token_ids == vllm_outcome.token_ids and len(outcome.token_ids or []) == 48, body
        decoded = qwen3.decode(outcome.token_ids, skip_special_tokens=True)
        assert outcome.text == decoded, body
        assert decoded.startswith(vllm_outcome.text) and len(decoded) - len(vllm_outcome.text) <= 1, body
        assert outcome.finish_reason == vllm_outcome.finish_reason == "length"
    after = metric_by_engine(service, "vllm:generation_tokens_total")
    made = {engine: after.get(engine, 0) - before.get(engine, 0) for engine in ("0", "1")}
    assert made["0"] > 0 and made["1"] > 0 and sum(made.values()) == 100 * 48, made
    assert service.stats()["engine"]["lost_workers"] == 0  # beside a busy-polling engine core, no worker lost


def test_the_engines_stop_rules_see_the_model_free_ids_as_vllms_server_does(
    reference: VllmServer, service: ServeProcess
) -> None:
    """A stop id taken from a request's own output ends it there in the engine core (finish `stop`, the id as
    stop_reason), a stop string in the front or worker, max_tokens with `length`: field by field as vLLM's server."""
    (first,) = asyncio.run(stream_all(reference, [seeded(7, 24, return_token_ids=True)]))
    assert first.token_ids is not None and len(first.token_ids) == 24
    stop_id = first.token_ids[9]
    cut = first.token_ids.index(stop_id)
    stop_string = first.text[len(first.text) // 2 :][:2]
    cases = [seeded(7, 24, stop_token_ids=[stop_id]), seeded(7, 24, stop=[stop_string]), seeded(7, 5)]
    cases = [{**case, "stream": False} for case in cases]
    with httpx.Client(timeout=60) as client:
        for body in cases:
            expected = client.post(f"{reference.url}/v1/completions", json=body).json()["choices"][0]
            answer = client.post(f"{service.url}/v1/completions", json=body).json()["choices"][0]
            for field in ("text", "finish_reason", "stop_reason"):
                assert answer[field] == expected[field], (body, field, answer, expected)
    assert expected["finish_reason"] == "length"
    stop_answer = httpx.post(f"{service.url}/v1/completions", json={**cases[0], "return_token_ids": True}, timeout=60)
    assert stop_answer.json()["choices"][0]["token_ids"] == first.token_ids[: cut + 1]


def test_clients_that_leave_are_aborted_on_the_engine_core_that_runs_them(service: ServeProcess) -> None:
    """20 streams that would each run 30 s: both cores run some; once their clients leave, every core's running
    count is back to 0 within a few steps, not when the requests would have ended."""

    async def leave_after_two_events() -> None:
        async with http_client(service) as client:
            reading = [asyncio.Event() for _ in range(20)]
            leave = asyncio.Event()

            async def one(index: int) -> None:
                body = {**seeded(300 + index, 2000), "stream": True}
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    events = 0
                    async for line in response.aiter_lines():
                        events += line.startswith("data: ")
                        if events == 2:
                            reading[index].set()
                            await leave.wait()
                            return  # the connection closes here

            clients = [asyncio.create_task(one(index)) for index in range(20)]
            await bounded(asyncio.gather(*(event.wait() for event in reading)), 60)
            await asyncio.sleep(0.5)  # a stats update or two
            running = metric_by_engine(service, "vllm:num_requests_running")
            assert running.get("0", 0) > 0 and running.get("1", 0) > 0, running  # both cores hold some
            leave.set()
            await asyncio.gather(*clients)

    asyncio.run(leave_after_two_events())
    left_at = time.monotonic()
    wait_for(
        lambda: sum(metric_by_engine(service, "vllm:num_requests_running").values()) == 0,
        10,
        what="every core's running count back to 0",
    )
    assert time.monotonic() - left_at < 5.0


def vllm_samples(url: str) -> Samples:
    """The `vllm:` samples of one scrape (creation times aside: multiprocess mode has none)."""
    return {key: value for key, value in scrape(url).items() if key[0].startswith("vllm:") and "_created" not in key[0]}


def test_each_engine_core_has_its_own_series_and_every_front_shows_the_same(data_parallel: DataParallelService) -> None:
    """Every step is recorded under its engine core's `engine` label; on one host, with `--api-server-count 2`
    (two fronts on one port), a scrape shows the same `vllm:` values whichever front answers (vLLM's multiprocess
    mode: one set of files)."""
    service = data_parallel.serve
    before = vllm_samples(service.url)
    with httpx.Client(base_url=service.url, timeout=120) as client:
        for seed in range(6):
            response = client.post("/v1/completions", json=seeded(seed, 8, temperature=1.0))
            assert response.status_code == 200, response.text

    last: list[Samples] = []

    def settled() -> Samples | None:
        """Both cores idle, the 48 tokens counted, and the same values as half a second ago (a step's stats are
        recorded just after its text went out)."""
        samples = vllm_samples(service.url)
        idle = total(samples, "vllm:num_requests_running") == 0 == total(samples, "vllm:num_requests_waiting")
        tokens = total(samples, "vllm:generation_tokens_total") - total(before, "vllm:generation_tokens_total")
        steady = last == [samples]
        last[:] = [samples]
        return samples if idle and tokens == 6 * 8 and steady else None

    scraped = wait_for(settled, 30, interval=0.5, what="the 48 generated tokens counted and both cores idle")
    engines = {dict(labels).get("engine") for name, labels in scraped if name == "vllm:num_requests_running"}
    assert engines == {"0", "1"}
    finished = total(scraped, "vllm:request_success_total", finished_reason="length")
    assert finished - total(before, "vllm:request_success_total", finished_reason="length") == 6
    fronts: set[int] = set()
    views = []
    for _ in range(12):  # a new connection each time: the kernel spreads them over the fronts
        with httpx.Client(base_url=service.url, timeout=30) as fresh:
            fronts.add(fresh.get("/stats").json()["front"]["pid"])
        views.append(vllm_samples(service.url))
    assert len(fronts) == (1 if data_parallel.second_host else 2)
    assert all(view == scraped for view in views)


def test_the_death_of_one_engine_core_ends_the_streams_with_an_error_and_health_says_so(
    data_parallel: DataParallelService,
) -> None:
    """The module's last test on each service (it ends it): the second core dies (on the second host: that host's
    core). As vLLM's server: its client takes any core's death for the engine's, every stream in flight ends with
    an error event, /health stops saying 200, and detok serve exits."""
    service = data_parallel.serve
    victim = data_parallel.core_pid(1)

    async def run() -> list[Outcome]:
        async with http_client(service) as client:
            arrivals: list[list[float]] = [[] for _ in range(8)]
            streams = [
                asyncio.create_task(bounded(stream_completion(client, seeded(400 + i, 2000), arrivals[i]), 60))
                for i in range(8)
            ]
            wait_for_arrivals = time.monotonic() + 30
            while not all(arrivals) and time.monotonic() < wait_for_arrivals:
                await asyncio.sleep(0.05)
            assert all(arrivals), [len(times) for times in arrivals]
            os.kill(victim, signal.SIGKILL)
            return await asyncio.gather(*streams)

    outcomes = asyncio.run(run())
    # SIGKILL is delivered at once, but a process with a large address space takes a moment to be torn down
    assert wait_for(lambda: not pid_alive(victim), 10, what="the killed engine core gone")
    for outcome in outcomes:
        assert outcome.status == 200 and outcome.error is not None, (outcome, service.log())
        # the engine process's error for its requests, or, when the process is gone before those frames reach the
        # front, the front's own for an engine that went away: either ends the stream with an error naming the engine
        assert "engine" in outcome.error["message"], outcome.error
    wait_for(lambda: service.proc.poll() is not None or service.health() != 200, 30, what="/health not 200")
    assert wait_for(lambda: service.proc.poll() is not None, 60, what="detok serve exiting")
    assert service.proc.returncode != 0
