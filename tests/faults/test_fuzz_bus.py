"""Fuzzing every bus socket with seeded, mutated frames (tests/frame_fuzz.py): the engine's PULL (as a front), the
engine's ROUTER (as a worker nobody started), the front's PULL (as a worker/engine) of a real `detok serve`, and
a real worker's DEALER (as its engine). No process may die, every frame that is not msgpack (or is multi-part)
must be counted, warnings are rate-limited, and a normal request still gives its exact text afterwards.

Default suite: 2,000 frames per socket; `-m slow`: 10,000."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq
from helpers.bus_peers import PlayedEngine, bus_config, short_runtime_dir, start_process, stop_process
from helpers.fault_helpers import (
    EchoCase,
    all_idle,
    echo_service,
    http_client,
    reference,
    service_pids,
    stream_completion,
)
from helpers.frame_fuzz import (
    FrameFuzzer,
    Fuzzed,
    from_worker_messages,
    to_engine_messages,
    to_front_messages,
    to_worker_messages,
)
from helpers.serve_helpers import ServeProcess, wait_for

from detok_worker.bus.codec import encode
from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.columns import token_batch
from detok_worker.bus.messages import (
    DetokParams,
    Hello,
    Open,
    RequestParams,
    SamplingParams,
    Shutdown,
    Submit,
    TokenBatch,
    Tokens,
    WorkerStats,
)
from detok_worker.worker.process import run_worker

DEFAULT_FRAMES = 2_000
SLOW_FRAMES = 10_000
# bad frames are logged once per kind and then every 1000th, not once per frame: at most this many lines per
# (process, kind) and 1000 frames, for the ~20 kinds the fuzz reaches (60 lines for the default 2,000 frames)
WARNING_KINDS = 20


def max_warning_lines(frames_per_socket: int) -> int:
    return WARNING_KINDS * (1 + frames_per_socket // 1000)


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(2, 2) as serve:
        yield serve


def send_all(sock: zmq.Socket[Any], frames: list[Fuzzed]) -> int:
    """Send every frame; returns how many are invalid on their own."""
    for fuzzed in frames:
        assert sock.poll(10_000, zmq.POLLOUT), "the receiver stopped taking frames (did it die?)"
        sock.send_multipart(fuzzed.parts, zmq.NOBLOCK)
    return sum(fuzzed.invalid for fuzzed in frames)


def bad_total(stats: dict[str, Any], part: str) -> int:
    return sum(stats[part]["bad_frames"].values()) if stats[part] else 0


def assert_alive(service: ServeProcess, pids: dict[str, int]) -> None:
    assert service_pids(service) == pids, f"a process died or was restarted; log:\n{service.log()}"


def check_still_serving(service: ServeProcess, tokenizer: Any, pids: dict[str, int]) -> None:
    wait_for(lambda: service.health() == 200, 15, what="the service healthy again")
    case = EchoCase(tokenizer.encode("Still serving after the fuzz: 日本語 😀, ok.").ids, [", ok"], 100)

    async def run() -> Any:
        async with http_client(service, connections=1) as client:
            return await asyncio.wait_for(stream_completion(client, case.body(True)), 30)

    outcome = asyncio.run(run())
    assert (outcome.text, outcome.finish_reason) == reference(tokenizer, case)
    assert_alive(service, pids)  # nothing died, nothing was restarted
    assert service.stats()["front"].get("handler_errors", 0) == 0


def fuzz_service_sockets(service: ServeProcess, tokenizer: Any, count: int, seed: int) -> None:
    pids = service_pids(service)
    before = service.stats()
    context = zmq.Context()
    sockets: list[zmq.Socket[Any]] = []

    def connect(kind: int, endpoint: str, routing_id: bytes | None = None) -> zmq.Socket[Any]:
        sock = context.socket(kind)
        sockets.append(sock)
        if routing_id is not None:
            sock.setsockopt(zmq.ROUTING_ID, routing_id)
        sock.connect(f"ipc://{service.runtime_dir}/{endpoint}")
        return sock

    try:
        engine_push = connect(zmq.PUSH, "engine.sock")
        engine_invalid = send_all(engine_push, FrameFuzzer(seed, to_engine_messages).frames(count))
        intruder = connect(zmq.DEALER, "workers.sock", b"fuzzer")  # a worker nobody started
        router_invalid = send_all(intruder, FrameFuzzer(seed + 1, from_worker_messages).frames(count))
        binary_id = connect(zmq.DEALER, "workers.sock", b"\xff\xfe-not-utf8")  # cannot be a worker id
        router_invalid += send_all(binary_id, [Fuzzed([encode(Hello("binary", 1))], invalid=True)] * 20)
        front_push = connect(zmq.PUSH, "front.sock")
        front_invalid = send_all(front_push, FrameFuzzer(seed + 2, to_front_messages).frames(count))
        for sock in sockets:
            sock.close(linger=5000)
    finally:
        for sock in sockets:
            sock.close(linger=0)
        context.term()

    def counted() -> bool:
        stats = service.stats()
        engine_new = bad_total(stats, "engine") - bad_total(before, "engine")
        front_new = bad_total(stats, "front") - bad_total(before, "front")
        return engine_new >= engine_invalid + router_invalid and front_new >= front_invalid

    wait_for(counted, 30, what="the invalid frames counted by the engine and the front")
    wait_for(
        lambda: service.stats()["engine"]["bad_frames"].get("worker_id", 0) >= 20,
        10,
        what="messages from a routing id that is not UTF-8 counted (not registered as a worker)",
    )
    check_still_serving(service, tokenizer, pids)
    # the fuzzed Submits were real requests, the intruder was assigned some: all end (it is declared dead)
    wait_for(lambda: all_idle(service), 30, what="live rids 0 everywhere after the fuzz")
    warnings = [line for line in service.log(tail=None).splitlines() if "bad frame" in line or "so far" in line]
    assert len(warnings) < max_warning_lines(count), warnings[:5]


def test_fuzz_engine_and_front_sockets(service: ServeProcess, tokenizer: Any) -> None:
    fuzz_service_sockets(service, tokenizer, DEFAULT_FRAMES, seed=100)


@pytest.mark.slow
def test_fuzz_engine_and_front_sockets_full(service: ServeProcess, tokenizer: Any) -> None:
    fuzz_service_sockets(service, tokenizer, SLOW_FRAMES, seed=200)


def test_a_submit_asking_for_a_billion_logprobs_is_refused_before_it_costs_the_engine(
    service: ServeProcess, tokenizer: Any
) -> None:
    """Found by the slow fuzz: the stub planned such a Submit's fake logprobs before the engine's limits refused
    it, and stalled for minutes (the front then declared the engine lost). Now the limits come first."""
    pids = service_pids(service)
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.connect(f"ipc://{service.runtime_dir}/engine.sock")
        params = RequestParams(max_tokens=64, sampling=SamplingParams(logprobs=10**9))
        push.send(encode(Submit("a-billion-logprobs", [1, 2, 3], params)))
        push.close(linger=5000)
    finally:
        context.term()
    stats_before = service.stats()["engine"]
    time.sleep(2.0)  # long past its arrival; a stalled engine sends no stats and takes no request from here on
    stats_after = service.stats()["engine"]
    assert stats_before is not None and stats_after is not None and stats_after["age_s"] < 1.5, stats_after
    check_still_serving(service, tokenizer, pids)


def fuzz_worker_socket(tokenizer: Any, count: int, seed: int) -> None:
    is_shutdown = msgspec.msgpack.Decoder(Shutdown | TokenBatch)
    frames = []
    for fuzzed in FrameFuzzer(seed, to_worker_messages).frames(count * 2):
        try:
            if isinstance(is_shutdown.decode(fuzzed.parts[0]), Shutdown):
                continue  # a well-formed Shutdown is an order to leave, not a fault
        except (msgspec.DecodeError, ValueError, RecursionError):
            pass
        frames.append(fuzzed)
    frames = frames[:count]
    invalid = sum(fuzzed.invalid for fuzzed in frames)
    worker_id = "w-fuzz"
    with short_runtime_dir() as runtime:
        config = bus_config(runtime)
        with PlayedEngine(config) as engine, FrontCollector(config) as front:
            process = start_process(run_worker, config, worker_id)
            try:
                identity, _ = engine.expect(Hello, 60)
                for fuzzed in frames:
                    engine.router.send_multipart([identity, *fuzzed.parts])

                def counted() -> WorkerStats | None:
                    stats = front.worker_stats.get(worker_id)
                    return stats if stats is not None and sum(stats.bad_frames.values()) >= invalid else None

                assert front.wait_for(lambda: counted() is not None, 60), front.worker_stats.get(worker_id)
                assert process.is_alive()
                ids = tokenizer.encode("Normal service: ünïcode 😀 and 中文.").ids
                opens = [Open("after-fuzz", [], DetokParams())]
                engine.send(
                    identity, token_batch(10**6, time.time_ns(), opens, [("after-fuzz", Tokens(ids, "length"))])
                )
                assert front.wait_done(["after-fuzz"], 20)
                assert front.requests["after-fuzz"].text == tokenizer.decode(ids)
                assert process.is_alive()
            finally:
                exit_code = stop_process(process)
            assert exit_code == 0


def test_fuzz_worker_socket(tokenizer: Any) -> None:
    fuzz_worker_socket(tokenizer, DEFAULT_FRAMES, seed=300)


@pytest.mark.slow
def test_fuzz_worker_socket_full(tokenizer: Any) -> None:
    fuzz_worker_socket(tokenizer, SLOW_FRAMES, seed=400)
