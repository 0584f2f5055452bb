"""vLLM's metrics from `detok serve --source vllm`, next to `vllm serve` on the same model and engine flags: the same
seeded load (streams of several lengths, some ended by a stop string, some left by their client) against each, both
/metrics compared, and each server's counters checked against what its clients got. vLLM's own server passes every
check made of detok's: they say what the counters mean."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from helpers.serve_helpers import REPO, sse_payloads
from helpers.vllm_cpu import (
    ENGINE_FLAGS,
    ENV,
    LOG_EVERY_SECOND,
    REFERENCE_MAX_NUM_SEQS,
    SERVED_NAME,
    STATS_LINE,
    VllmServer,
    detok_vllm,
    model_dir,
    require_venv,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(900)  # two engine starts of ~30-60 s each, more on a loaded machine

LENGTHS = (4, 12, 24, 40)
FULL_BATCH_TOKENS = 200
# 50 measured streams: 31 plain, a long one, 10 ended by a stop string, 8 left by their client; the engines run
# REFERENCE_MAX_NUM_SEQS at once, so under this load some wait (vllm:num_requests_waiting above 0). The long one and
# the first REFERENCE_MAX_NUM_SEQS - 1 plain ones (FULL_BATCH_TOKENS each) are sent first: the running gauge shows
# the full batch from the step that admits the last of them for more than a hundred steps (a step's stats count the
# requests still running after it). A loaded server answers a scrape late (its API process has the streams to
# serve); the window has to outlast that
PLAIN = sorted(
    (
        {
            "prompt": f"Story number {seed}:",
            "max_tokens": FULL_BATCH_TOKENS if seed < REFERENCE_MAX_NUM_SEQS - 1 else LENGTHS[seed % len(LENGTHS)],
            "temperature": 1.0,
            "seed": seed,
        }
        for seed in range(31)
    ),
    key=lambda body: -body["max_tokens"],
)
LONG = {"prompt": "A long story", "max_tokens": 160, "temperature": 1.0, "seed": 99}
STOPPED = [{"prompt": f"Tale {seed} begins", "max_tokens": 48, "temperature": 1.0, "seed": seed} for seed in range(10)]
# a leaving client reads LEFT_AFTER_EVENTS text events, then closes its connection; its max_tokens is more than its
# engine makes in the seconds a server may take to see it gone on a busy machine (one that runs out anyway counts as
# finished: see the test), and no end-of-text id ends it first
LEFT_MAX_TOKENS = 1500
LEFT = [
    {
        "prompt": f"Long story {seed}",
        "max_tokens": LEFT_MAX_TOKENS,
        "temperature": 1.0,
        "seed": seed,
        "ignore_eos": True,
    }
    for seed in range(8)
]
LEFT_AFTER_EVENTS = 3

Shape = tuple[str, frozenset[str], tuple[float, ...]]  # a family's type, label names and histogram buckets


@dataclass
class Run:
    """What one server's clients got, and what its /metrics said before, after the finished streams and after the
    left ones."""

    usage_completion: int = 0
    usage_prompt: int = 0
    finishes: Counter[str] = field(default_factory=Counter)
    running_under_load: float = 0.0  # the most any scrape showed while the measured streams ran
    waiting_under_load: float = 0.0
    gauges: list[tuple[float, float, float]] = field(default_factory=list)  # (s into the load, running, waiting)
    scrapes: dict[str, dict[str, Any]] = field(default_factory=dict)
    left_finishes: list[str | None] = field(default_factory=list)  # what the leaving clients saw (None: no end)
    log: str = ""


def scrape(client: httpx.Client) -> dict[str, Any]:
    """/metrics: every `vllm:` sample by (sample name, labels), and each `vllm:` family's shape."""
    response = client.get("/metrics")
    assert response.status_code == 200
    families = list(text_string_to_metric_families(response.text))
    names = {family.name for family in families}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    shapes: dict[str, Shape] = {}
    for family in families:
        if not family.name.startswith("vllm:"):
            continue
        if family.name.endswith("_created") and family.name.removesuffix("_created") in names:
            # a counter's or histogram's creation time, which the text format shows as a gauge of its own;
            # prometheus_client's multiprocess mode (detok's, and vLLM's with --api-server-count > 1) has none
            continue
        labels = frozenset(name for sample in family.samples for name in sample.labels if name != "le")
        buckets = sorted({float(sample.labels["le"]) for sample in family.samples if "le" in sample.labels})
        shapes[family.name] = (family.type, labels, tuple(buckets))
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return {"samples": samples, "shapes": shapes}


def total(scraped: dict[str, Any], sample_name: str, **labels: str) -> float:
    """The sum of a sample over every series whose labels include `labels`."""
    want = set(labels.items())
    return sum(value for (name, series), value in scraped["samples"].items() if name == sample_name and want <= series)


async def stream(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    leave_after: int | None = None,
) -> dict[str, Any]:
    """One streamed completion with usage. `leave_after`: close the connection after that many text events."""
    payload = {**body, "model": SERVED_NAME, "stream": True, "stream_options": {"include_usage": True}}
    outcome: dict[str, Any] = {"text": "", "finish": None, "usage": None, "events": 0}
    async with client.stream("POST", "/v1/completions", json=payload) as response:
        assert response.status_code == 200, await response.aread()
        async for event in sse_payloads(response.aiter_lines()):
            if event.get("usage"):
                outcome["usage"] = event["usage"]
            for choice in event.get("choices", []):
                if choice["text"]:
                    outcome["text"] += choice["text"]
                    outcome["events"] += 1
                outcome["finish"] = choice.get("finish_reason") or outcome["finish"]
            if leave_after is not None and outcome["events"] >= leave_after:
                return outcome  # leaving the block closes the connection: the server aborts the request
    return outcome


def stop_string(text: str) -> str | None:
    """Three characters from the middle of `text` whose first occurrence is well before its end."""
    for start in range(len(text) // 3, max(len(text) - 4, 0)):
        piece = text[start : start + 3]
        if "\ufffd" not in piece and piece.strip() and text.find(piece) < len(text) - 4:
            return piece
    return None


async def wait_idle(scrape_now: Callable[[], dict[str, Any]], timeout: float = 30.0) -> dict[str, Any]:
    """/metrics once the server says no request runs or waits (vLLM's gauges follow the engine's steps) and two
    scrapes half a second apart agree (a step's stats are recorded just after its text went out)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        scraped = await asyncio.to_thread(scrape_now)
        idle = total(scraped, "vllm:num_requests_running") == 0 and total(scraped, "vllm:num_requests_waiting") == 0
        if idle and last is not None and scraped["samples"] == last["samples"]:
            return scraped
        last = scraped if idle else None
        await asyncio.sleep(0.5)
    raise AssertionError("the server did not settle idle: vllm:num_requests_running/waiting above 0, or moving")


async def watch_gauges(run: Run, scrape_now: Callable[[], dict[str, Any]], done: asyncio.Event) -> None:
    """Scrapes /metrics until `done`, keeping the most running and waiting requests any scrape showed."""
    started = time.monotonic()
    while not done.is_set():
        scraped = await asyncio.to_thread(scrape_now)
        running = total(scraped, "vllm:num_requests_running")
        waiting = total(scraped, "vllm:num_requests_waiting")
        run.gauges.append((round(time.monotonic() - started, 2), running, waiting))
        run.running_under_load = max(run.running_under_load, running)
        run.waiting_under_load = max(run.waiting_under_load, waiting)
        await asyncio.sleep(0.2)


async def load(url: str, run: Run, scrape_now: Callable[[], dict[str, Any]]) -> None:
    # no idle connection kept between phases: a server closes one after its keep-alive timeout, and a request sent
    # on it just then fails
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        # the texts the stop-string streams have without a stop: their stops are taken from them
        references = await asyncio.gather(*(stream(client, body) for body in STOPPED))
        stopped = []
        for body, reference in zip(STOPPED, references, strict=True):
            stop = stop_string(reference["text"])
            assert stop is not None, reference
            stopped.append({**body, "stop": [stop]})
        run.scrapes["before"] = await wait_idle(scrape_now)

        loaded = asyncio.Event()
        watcher = asyncio.create_task(watch_gauges(run, scrape_now, loaded))
        outcomes = await asyncio.gather(stream(client, LONG), *(stream(client, body) for body in PLAIN + stopped))
        loaded.set()
        await watcher
        for outcome in outcomes:
            run.usage_completion += outcome["usage"]["completion_tokens"]
            run.usage_prompt += outcome["usage"]["prompt_tokens"]
            run.finishes[outcome["finish"]] += 1
        assert sum(outcome["finish"] == "stop" for outcome in outcomes[-len(stopped) :]) == len(stopped)
        run.scrapes["finished"] = await wait_idle(scrape_now)

        left = await asyncio.gather(*(stream(client, body, leave_after=LEFT_AFTER_EVENTS) for body in LEFT))
        run.left_finishes = [outcome["finish"] for outcome in left]
        run.scrapes["left"] = await wait_idle(scrape_now)


def run_load(url: str) -> Run:
    run = Run()
    with httpx.Client(base_url=url, timeout=30) as client:
        asyncio.run(load(url, run, lambda: scrape(client)))
    return run


@pytest.fixture(scope="module")
def vllm_run(reference_vllm: VllmServer) -> Run:
    """The session's vLLM server (other modules' traffic before counts in no delta), stopped once measured."""
    try:
        return run_load(reference_vllm.url)
    finally:
        reference_vllm.stop()


@pytest.fixture(scope="module")
def detok_run(vllm_run: Run) -> Iterator[Run]:
    """Started after vLLM's own server has stopped (two engine cores on two CPUs would slow both)."""
    with detok_vllm(engine_flags=("--max-num-seqs", str(REFERENCE_MAX_NUM_SEQS)), env=LOG_EVERY_SECOND) as service:
        run = run_load(service.url)
        run.log = service.log(None)
        yield run


@pytest.fixture(params=["vllm", "detok"])
def run(request: pytest.FixtureRequest) -> Run:
    return request.getfixturevalue(f"{request.param}_run")


def delta(run: Run, sample_name: str, since: str = "before", until: str = "finished", **labels: str) -> float:
    return total(run.scrapes[until], sample_name, **labels) - total(run.scrapes[since], sample_name, **labels)


def test_every_vllm_family_with_its_type_labels_and_buckets(vllm_run: Run, detok_run: Run) -> None:
    theirs, ours = vllm_run.scrapes["left"]["shapes"], detok_run.scrapes["left"]["shapes"]
    assert len(theirs) > 30  # vLLM's server exports its families (a scrape that found none would prove nothing)
    assert not sorted(set(theirs) - set(ours)), "vLLM's families that detok does not export"
    different = {name: (shape, ours[name]) for name, shape in theirs.items() if ours[name] != shape}
    assert not different, f"families whose type, label names or buckets differ (vLLM's, detok's): {different}"


def test_counters_equal_what_the_clients_got(run: Run) -> None:
    """Generation tokens: the completion tokens the clients were told (usage), stop strings included; prompt
    tokens: the prompts'; request_success by finished_reason: how the streams ended."""
    finished = len(PLAIN) + 1 + len(STOPPED)
    assert delta(run, "vllm:generation_tokens_total") == run.usage_completion
    assert delta(run, "vllm:prompt_tokens_total") == run.usage_prompt
    reasons = ("stop", "length", "abort", "error")
    counted = {reason: delta(run, "vllm:request_success_total", finished_reason=reason) for reason in reasons}
    assert counted == {reason: run.finishes[reason] for reason in reasons}, (counted, run.finishes)
    assert delta(run, "vllm:request_success_total") == finished
    assert delta(run, "vllm:e2e_request_latency_seconds_count") == finished
    assert delta(run, "vllm:request_generation_tokens_sum") == run.usage_completion
    assert delta(run, "vllm:request_prompt_tokens_sum") == run.usage_prompt
    # every finished request once in the histograms vLLM fills per finished request (n = 1 each here)
    assert delta(run, "vllm:request_params_n_count") == finished
    assert delta(run, "vllm:request_max_num_generation_tokens_sum") == run.usage_completion
    assert delta(run, "vllm:time_to_first_token_seconds_count") == finished


def test_left_streams_count_as_generated_not_as_finished(run: Run) -> None:
    """A client that goes away aborts its request: vLLM counts its ids so far as generated, and the request as
    neither finished nor aborted in request_success. Unless the request ran to its max_tokens before the server saw
    its client go: a server short of CPU beside the engine core falls behind it (vLLM's API process and detok's
    relay alike), and the engine may have made every id of a left request by the time its first text reaches its
    client; it then counts as finished "length", with all its ids. (That a left request is aborted on the engine:
    test_vllm_engine.py and test_vllm_model_free.py.)"""
    by_reason = {
        reason: delta(run, "vllm:request_success_total", since="finished", until="left", finished_reason=reason)
        for reason in ("stop", "length", "abort", "error")
    }
    ran_out = by_reason.pop("length")
    requests = [line for line in run.log.splitlines() if "path=/v1/completions" in line][-len(LEFT) :]
    late = [line for line in run.log.splitlines() if "no worker verdict" in line]
    assert not any(by_reason.values()), (by_reason, run.left_finishes, late, requests)
    ids_of_ended = delta(run, "vllm:request_generation_tokens_sum", since="finished", until="left")
    assert ids_of_ended == ran_out * LEFT_MAX_TOKENS, (ran_out, ids_of_ended, late, requests)
    assert delta(run, "vllm:generation_tokens_total", since="finished", until="left") >= len(LEFT) * LEFT_AFTER_EVENTS
    assert delta(run, "vllm:prompt_tokens_total", since="finished", until="left") > 0


def test_running_and_waiting_gauges_under_load_and_zero_when_idle(run: Run) -> None:
    assert run.running_under_load == REFERENCE_MAX_NUM_SEQS, run.gauges  # the engine's batch full
    assert run.waiting_under_load > 0, run.gauges  # the rest of the load queued behind it
    for moment in ("before", "finished", "left"):
        assert total(run.scrapes[moment], "vllm:num_requests_running") == 0
        assert total(run.scrapes[moment], "vllm:num_requests_waiting") == 0


def test_vllms_stats_line_in_the_engine_log(detok_run: Run) -> None:
    lines = [line for line in detok_run.log.splitlines() if STATS_LINE in line]
    assert lines, "no vLLM stats line in the log"
    assert all(" engine[" in line for line in lines)  # written by the engine process


# VllmStats on made-up engine steps, in vLLM's interpreter: requests A (stop strings: its ids wait for its end), C and
# D (stop strings, ended by the engine) and B (none) get one id a step; after 3 steps A's worker says it kept 2 (the
# third came after its stop) and B's client leaves; C and D end at their third step with max_tokens, and their
# workers' verdicts come after: C's max_tokens stands, D's worker found a stop string after its first id; E (stop
# strings) ends for its client (the front's Delivered) before its worker's Finish (kept 2) reaches the engine
STEPS_SCRIPT = """
import json, sys, time
from types import SimpleNamespace
from prometheus_client import REGISTRY
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.metrics.stats import SchedulerStats
from detok_worker.bus.messages import Finish
from detok_worker.engine.vllm_stats import VllmStats

args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
stats = VllmStats(config, [0])
for rid, deferred in (("A", True), ("B", False), ("C", True), ("D", True), ("E", True)):
    request = SimpleNamespace(
        request_id=rid, prompt_token_ids=[1, 2], sampling_params=SimpleNamespace(max_tokens=3), lora_request=None
    )
    stats.added(request, time.time(), deferred=deferred)
for step in range(3):
    finish = FinishReason.LENGTH if step == 2 else None
    outputs = [EngineCoreOutput(rid, [7], finish_reason=finish if rid in "CD" else None) for rid in "ABCDE"]
    stats.step(EngineCoreOutputs(outputs=outputs, scheduler_stats=SchedulerStats(num_running_reqs=3)))
verdicts = {"A": Finish("A", "stop", "x", 2), "C": Finish("C", "length", None, 3), "D": Finish("D", "stop", "y", 1)}
stats.ended(["A", "B", "E"], verdicts, delivered=["E"])
stats.ended([], {"E": Finish("E", "stop", "z", 2)})
labels = {"model_name": config.model_config.served_model_name, "engine": "0"}
samples = {
    "generated": ("vllm:generation_tokens_total", {}),
    "stop": ("vllm:request_success_total", {"finished_reason": "stop"}),
    "length": ("vllm:request_success_total", {"finished_reason": "length"}),
    "abort": ("vllm:request_success_total", {"finished_reason": "abort"}),
    "finished ids": ("vllm:request_generation_tokens_sum", {}),
    "finished n": ("vllm:request_params_n_count", {}),
}
values = {key: REGISTRY.get_sample_value(name, {**labels, **extra}) for key, (name, extra) in samples.items()}
print(json.dumps(values))
"""


def test_ids_past_a_workers_stop_are_not_generation_tokens() -> None:
    """The engine makes ids until a worker's stop reaches it; vLLM, whose own stop check runs on each step's
    output, never counts those: detok counts as many as the worker kept."""
    result = subprocess.run(
        [str(require_venv()), "-c", STEPS_SCRIPT, "--model", str(model_dir()), *ENGINE_FLAGS],
        capture_output=True, text=True, env=dict(os.environ, **ENV, PYTHONPATH=str(REPO)), timeout=300, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    values = json.loads(result.stdout.strip().splitlines()[-1])
    # A: 2 (kept), B: 3 (its client left: generated, not finished), C: 3 (ended by the engine), D and E: 1 and 2
    assert values == {"generated": 11, "stop": 3, "length": 1, "abort": 0, "finished ids": 8, "finished n": 4}
