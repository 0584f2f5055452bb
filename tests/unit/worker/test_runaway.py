"""A request whose decoder or parser fails or loops ends alone: a parser that raises ends its rid with an error (the
worker goes on), and one that loops is interrupted by the worker's CPU guard (RunawayGuard) after
worker.runaway_cpu_s, while the guard's timer keeps the worker's heartbeat tick running meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.parse_cases import CASES, case_ids, params_of

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, Tokens
from detok_worker.parse.base import ParsedOutput
from detok_worker.worker.process import RunawayGuard
from detok_worker.worker.state import WorkerState

CASE = CASES[0]  # a chat output with reasoning and a tool call
LIMIT_S = 0.3
STALL_S = 20.0  # a "loop" that ends on its own, so a broken guard fails the test instead of hanging it


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_fixture_tokenizer(CASE.tokenizer)


_STALL = """
def stall(*_):
    if not calls:
        calls.append(1)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            pass
    return ParsedOutput()
"""


def stall_in(module: str, seconds: float = STALL_S) -> Callable[..., ParsedOutput]:
    """A loop (on its first call) whose code belongs to `module`: the guard interrupts only a rid's own decode
    and parse code."""
    namespace = {"__name__": module, "time": time, "seconds": seconds, "calls": [], "ParsedOutput": ParsedOutput}
    exec(_STALL, namespace)  # noqa: S102 - a fixed function, defined in another module's namespace
    return namespace["stall"]


def raising(*_: object) -> ParsedOutput:
    raise RuntimeError("a parser bug")


def opened(tokenizer: Any, params: DetokParams | None = None) -> tuple[WorkerState, list[int]]:
    """A worker with rids r1 and r2 open on the case's prompt, each given the output's first 3 ids."""
    tail, ids = case_ids(tokenizer, CASE)
    params = params or params_of(tokenizer, CASE)
    worker = WorkerState(tokenizer, "w0")
    opens = [Open("r1", tail, params), Open("r2", tail, params)]
    worker.handle_batch(token_batch(0, 0, opens, [("r1", Tokens(ids[:3])), ("r2", Tokens(ids[:3]))]))
    return worker, ids


def next_step(worker: WorkerState, ids: list[int], tick: Callable[[], None] | None = None) -> dict[str, Reply]:
    """The output's ids 3..11 of both rids, one id a row (the plain rows' path when the rid has no parser)."""
    items = [(rid, Tokens([token_id])) for token_id in ids[3:12] for rid in ("r1", "r2")]
    replies: dict[str, Reply] = {}
    for delta in text_deltas(worker.handle_batch(token_batch(1, 0, [], items), tick).text_batch):
        reply = replies.setdefault(delta.rid, Reply())
        reply.text += delta.text
        reply.parsed.append(delta.parsed)
        reply.finish, reply.error = delta.finish, delta.error
    return replies


@dataclass
class Reply:
    text: str = ""
    parsed: list[Any] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None


def assert_ends_parsed_at(reply: Reply, offsets: tuple[int, int]) -> None:
    """The failed rid's last delta is an empty parsed one where its channels stood (the front's reassembly of a
    parsed stream then sees no gap, and the client gets the error)."""
    last = reply.parsed[-1]
    assert last is not None
    assert (last.content, last.content_offset, last.reasoning, last.reasoning_offset) == (
        "",
        offsets[0],
        "",
        offsets[1],
    )


@pytest.fixture
def guard() -> Iterator[tuple[RunawayGuard, list[float]]]:
    """A guard whose tick records when it ran; armed as the worker process arms it around a batch."""
    ticks: list[float] = []
    runaway = RunawayGuard(LIMIT_S, 0.05, lambda: ticks.append(time.monotonic()))
    assert runaway.on  # pytest runs tests in the main thread
    runaway.arm()
    try:
        yield runaway, ticks
    finally:
        runaway.disarm()


def test_a_parser_that_raises_ends_only_its_request(tokenizer: Any) -> None:
    worker, ids = opened(tokenizer)
    reference, _ = opened(tokenizer)
    parsing = worker.live["r1"].parsing
    parsing.parser.feed = raising  # type: ignore[method-assign]
    offsets = (parsing.content_offset, parsing.reasoning_offset)
    deltas = next_step(worker, ids)
    assert_ends_parsed_at(deltas["r1"], offsets)
    assert (deltas["r1"].finish, deltas["r1"].error, deltas["r1"].text) == (
        "error",
        "output parsing failed: a parser bug",
        "",
    )
    assert list(worker.live) == ["r2"]
    assert deltas["r2"] == next_step(reference, ids)["r2"]  # the other request is untouched


def test_a_parser_that_raises_at_the_end_ends_its_request_with_the_error(tokenizer: Any) -> None:
    worker, ids = opened(tokenizer)
    parsing = worker.live["r1"].parsing
    parsing.parser.finish = raising  # type: ignore[method-assign]
    result = worker.handle_batch(token_batch(1, 0, [], [("r1", Tokens(ids[3:5], "length"))]))
    (delta,) = text_deltas(result.text_batch)
    assert (delta.finish, delta.error) == ("error", "output parsing failed: a parser bug")
    assert delta.parsed is not None and delta.parsed.content == delta.parsed.reasoning == ""
    assert list(worker.live) == ["r2"]


def test_a_looping_parser_is_interrupted_and_the_heartbeats_go_on(
    tokenizer: Any, guard: tuple[RunawayGuard, list[float]]
) -> None:
    runaway, ticks = guard
    worker, ids = opened(tokenizer)
    reference, _ = opened(tokenizer)
    parsing = worker.live["r1"].parsing
    parsing.parser.feed = stall_in("detok_worker.parse.base")  # type: ignore[method-assign]
    offsets = (parsing.content_offset, parsing.reasoning_offset)
    started = time.monotonic()
    deltas = next_step(worker, ids, runaway.progress)
    assert time.monotonic() - started < STALL_S / 2
    assert deltas["r1"].finish == "error"
    assert deltas["r1"].error == f"output parsing failed: it took more than {LIMIT_S:g} s of CPU (worker.runaway_cpu_s)"
    assert_ends_parsed_at(deltas["r1"], offsets)
    assert deltas["r2"] == next_step(reference, ids)["r2"]
    assert len([tick for tick in ticks if tick >= started]) >= 3  # the guard's timer ran the tick during the stall


def test_a_loop_outside_a_rids_code_is_not_interrupted(tokenizer: Any, guard: tuple[RunawayGuard, list[float]]) -> None:
    """Library code (a lock held by logging, say) is never interrupted: the loop runs to its end."""
    runaway, _ = guard
    worker, ids = opened(tokenizer)
    worker.live["r1"].parsing.parser.feed = stall_in("logging", 4 * LIMIT_S)  # type: ignore[method-assign]
    started = time.monotonic()
    deltas = next_step(worker, ids, runaway.progress)
    assert time.monotonic() - started >= 4 * LIMIT_S
    assert deltas["r1"].error is None and worker.bad == {}


def test_a_looping_decoder_on_the_hot_path_is_interrupted(
    tokenizer: Any, guard: tuple[RunawayGuard, list[float]]
) -> None:
    runaway, _ = guard
    worker, ids = opened(tokenizer, DetokParams())  # no parser: the plain rows' loop
    assert worker.live["r1"].plain
    worker.live["r1"].decoder.process_one = stall_in("detok_worker.stream.stop.decoder")  # type: ignore[method-assign]
    deltas = next_step(worker, ids, runaway.progress)
    assert deltas["r1"].finish == "error"
    assert deltas["r1"].error == f"detokenization failed: it took more than {LIMIT_S:g} s of CPU (worker.runaway_cpu_s)"
    assert (
        deltas["r2"].finish is None
        and deltas["r2"].text == tokenizer.decode(ids[:12])[len(tokenizer.decode(ids[:3])) :]
    )


def test_steady_progress_is_not_interrupted(tokenizer: Any, guard: tuple[RunawayGuard, list[float]]) -> None:
    """Work that ticks (an Open, or TICK_EVERY_ITEMS rows, at a time) never adds up to the limit."""
    runaway, _ = guard
    _, ids = case_ids(tokenizer, CASE)
    worker = WorkerState(tokenizer, "w0")
    params = DetokParams()
    rids = [f"r{i}" for i in range(3000)]
    batch = token_batch(0, 0, [Open(rid, [], params) for rid in rids], [(rid, Tokens(ids[:40])) for rid in rids])
    deadline = time.process_time() + 4 * LIMIT_S
    while time.process_time() < deadline:  # several limits' worth of CPU in one batch
        worker.handle_batch(batch, runaway.progress)
        batch = token_batch(1, 0, [], [(rid, Tokens(ids[:40])) for rid in rids])
    assert worker.bad == {} and len(worker.live) == len(rids)
