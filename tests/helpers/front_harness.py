"""Test harness for the HTTP front: the real app under a real uvicorn server on a free port (in a thread), and a
test-played engine + worker speaking the real bus protocol over real ZMQ sockets."""

from __future__ import annotations

import contextlib
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
import zmq

from detok_worker.bus.codec import encode, engine_decoder
from detok_worker.bus.messages import (
    Abort,
    AdapterAnswer,
    AdapterCall,
    EngineStats,
    PromptCached,
    PromptLogprobs,
    Reject,
    Submit,
    TextDelta,
    WorkerStats,
)
from detok_worker.bus.request_fields import GRPC_REFUSED_NAMES, VLLM_SOURCE
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import DetokConfig, load_config
from detok_worker.front.app import create_app
from helpers.bus_rows import text_batch

PLAYED_WORKER = "played-worker"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def front_config(**overrides: Any) -> Iterator[DetokConfig]:
    """A config with a private short ipc runtime dir and a free HTTP port; dotted-key overrides on top."""
    runtime_dir = tempfile.mkdtemp(prefix="dtf-")
    try:
        yield load_config(None, {"bus.runtime_dir": runtime_dir, "front.port": free_port(), **overrides})
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)


class FrontServer:
    """create_app(config, tokenizer) served by uvicorn in a background thread."""

    def __init__(self, config: DetokConfig, tokenizer: Any) -> None:
        self.config = config
        self.app = create_app(config, tokenizer)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=config.front.port,
                lifespan="on",
                log_config=None,
                access_log=False,
                timeout_graceful_shutdown=1,
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="test-front", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.front.port}"

    @property
    def front(self) -> Any:
        return self.app.state.front

    def __enter__(self) -> FrontServer:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the front did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        assert not self.thread.is_alive(), "the front did not stop"


# A plan is what the played worker sends for one request: one TextDelta per engine step.
Plan = list[TextDelta]


def decode_plan(
    tokenizer: Any,
    rid: str,
    ids: list[int],
    *,
    finish: str = "length",
    stop_reason: str | int | None = None,
    tokens_per_delta: int = 1,
    with_ids: bool = False,
) -> Plan:
    """Deltas as a worker would send them for `ids`: at each step the newly completed characters of
    decode(ids[:k]) (held back while the text ends in an incomplete character), offsets and n_tokens cumulative;
    `with_ids` (a request with return_token_ids): each delta carries the ids consumed since the previous delta."""
    deltas: Plan = []
    emitted = ""
    shown = 0  # ids already on a delta
    for k in range(tokens_per_delta, len(ids) + tokens_per_delta, tokens_per_delta):
        k = min(k, len(ids))
        text = tokenizer.decode(ids[:k], skip_special_tokens=True)
        last = k == len(ids)
        if text.endswith("\ufffd") and not last:
            deltas.append(TextDelta(rid, len(emitted), "", k))
            continue
        new = text[len(emitted) :]
        delta = TextDelta(
            rid, len(emitted), new, k, finish=finish if last else None, stop_reason=stop_reason if last else None
        )
        if with_ids:
            delta.token_ids, shown = list(ids[shown:k]), k
        deltas.append(delta)
        emitted = text
    return deltas


def played_prompt_logprobs(submit: Submit) -> PromptLogprobs:
    """What the played engine answers a request's prompt_logprobs with: row i (prompt token i + 1) holds that token
    (logprob -(i + 1), rank i + 2) then k candidates, ids 1000, 1001, ... with logprobs -0.5, -1.5, ... (k = -1: 3)."""
    k = submit.params.sampling.prompt_logprobs
    top = 3 if k == -1 else k or 0
    ids = submit.prompt_ids
    return PromptLogprobs(
        submit.rid,
        [[token_id, *range(1000, 1000 + top)] for token_id in ids[1:]],
        [[-(i + 1.0), *(-0.5 - j for j in range(top))] for i in range(len(ids) - 1)],
        [i + 2 for i in range(len(ids) - 1)],
    )


@dataclass
class PlayedEngine:
    """Plays the engine (PULL at the engine endpoint: Submit/Abort) and one worker (PUSH to the front:
    TextBatch, WorkerStats; plus EngineStats, Reject and PromptLogprobs) in a thread. `plan(submit)` decides what a
    request gets: a list of TextDeltas sent one per step (none: nothing), or a string to Reject it with. A request
    that asks for prompt logprobs gets `prompt_plan(submit)` first (None: nothing)."""

    config: DetokConfig
    plan: Callable[[Submit], Plan | str]
    step_s: float = 0.005
    send_stats: bool = True
    served_model_name: str = ""  # the EngineStats' (the model name an engine serves)
    engine_version: str = ""  # the EngineStats' (a real engine's version)
    vocab_size: int = 0  # the EngineStats' (the model's vocabulary size)
    system_fingerprint: str = ""  # the EngineStats' (a real engine's system_fingerprint)
    # the EngineStats' request fields the engine does not pass on; None: what detok's engine of config.engine.source
    # announces (none for vllm, else those the gRPC API lacks)
    refused_fields: tuple[str, ...] | None = None
    cached_tokens: tuple[int, int] = (5, 2)  # the PromptCached a request with report_cached gets
    prompt_plan: Callable[[Submit], PromptLogprobs | None] = played_prompt_logprobs
    # the EngineStats' LoRA adapters (None: the engine reports none), and the answer to an adapter call (None: no
    # answer); every call is kept in `adapter_calls`
    lora_adapters: dict[str, str] | None = None
    sampling_defaults: dict[str, int | float] = field(default_factory=dict)  # the EngineStats' (the model's)
    adapter_answer: Callable[[AdapterCall], AdapterAnswer | None] = lambda call: None
    adapter_calls: queue.Queue[AdapterCall] = field(default_factory=queue.Queue)
    submits: queue.Queue[Submit] = field(default_factory=queue.Queue)
    aborts: queue.Queue[tuple[Abort, float]] = field(default_factory=queue.Queue)
    _jobs: dict[str, list[TextDelta]] = field(default_factory=dict)
    _extra: queue.Queue[bytes] = field(default_factory=queue.Queue)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, name="played-engine", daemon=True)

    def __enter__(self) -> PlayedEngine:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def send_raw(self, frame: bytes) -> None:
        """Send any frame (valid or not) to the front from the engine's thread."""
        self._extra.put(frame)

    def live(self) -> int:
        return len(self._jobs)

    def _run(self) -> None:
        decoder = engine_decoder()
        with BusSockets(self.config) as bus:
            pull = bus.engine_pull()
            push = bus.front_push()
            next_stats = 0.0
            while not self._stop.is_set():
                if pull.poll(int(self.step_s * 1000)):
                    while True:
                        try:
                            frame = pull.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._on_message(decoder.decode(frame), push)
                while not self._extra.empty():
                    push.send(self._extra.get())
                self._step(push)
                now = time.monotonic()
                if self.send_stats and now >= next_stats:
                    next_stats = now + 0.1
                    workers = {PLAYED_WORKER: len(self._jobs)}
                    stats = EngineStats(
                        len(self._jobs),
                        workers,
                        {},
                        0,
                        0,
                        served_model_name=self.served_model_name,
                        engine_version=self.engine_version,
                        vocab_size=self.vocab_size,
                        system_fingerprint=self.system_fingerprint,
                        lora_adapters=self.lora_adapters,
                        refused_fields=self._refused_fields(),
                        sampling_defaults=self.sampling_defaults,
                    )
                    push.send(encode(stats))
                    push.send(encode(WorkerStats(PLAYED_WORKER, 0, len(self._jobs), {}, 0, 0)))

    def _refused_fields(self) -> list[str]:
        if self.refused_fields is not None:
            return list(self.refused_fields)
        return [] if self.config.engine.source == VLLM_SOURCE else list(GRPC_REFUSED_NAMES)

    def _on_message(self, message: object, push: zmq.Socket[Any]) -> None:
        if isinstance(message, Submit):
            self.submits.put(message)
            planned = self.plan(message)
            if isinstance(planned, str):
                push.send(encode(Reject(message.rid, planned)))
                return
            if message.params.sampling.prompt_logprobs is not None:
                answer = self.prompt_plan(message)
                if answer is not None:
                    push.send(encode(answer))
            if message.params.report_cached:
                push.send(encode(PromptCached(message.rid, *self.cached_tokens)))
            if planned:  # an empty plan: the request gets nothing (a test sends what it wants)
                self._jobs[message.rid] = list(planned)
        elif isinstance(message, Abort):
            self.aborts.put((message, time.monotonic()))
            self._jobs.pop(message.rid, None)
        elif isinstance(message, AdapterCall):
            self.adapter_calls.put(message)
            answer = self.adapter_answer(message)
            if answer is not None:
                self.lora_adapters = answer.lora_adapters
                push.send(encode(answer))

    def _step(self, push: zmq.Socket[Any]) -> None:
        items = []
        for rid in list(self._jobs):
            job = self._jobs[rid]
            items.append(job.pop(0))
            if not job:
                del self._jobs[rid]
        if items:
            push.send(encode(text_batch(PLAYED_WORKER, time.time_ns(), 0, items)))


@dataclass
class FrontUnderTest:
    server: FrontServer
    engine: PlayedEngine
    tokenizer: Any

    @property
    def url(self) -> str:
        return self.server.url

    def set_plan(self, plan: Callable[[Submit], Plan | str]) -> None:
        self.engine.plan = plan

    def echo_plan(self, submit: Submit) -> Plan:
        """Default behaviour: the output is the prompt's own ids (like engine_stub's echo source)."""
        return decode_plan(self.tokenizer, submit.rid, submit.prompt_ids, with_ids=submit.params.detok.return_token_ids)

    def wait_healthy(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.server.front.dispatcher.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError("the front never saw the played engine")
            time.sleep(0.01)


@contextlib.contextmanager
def running_front(
    tokenizer: Any, *, send_stats: bool = True, refused_fields: tuple[str, ...] | None = None, **overrides: Any
) -> Iterator[FrontUnderTest]:
    """A front (real app, real uvicorn) wired to a played engine over real ipc sockets (`refused_fields`:
    PlayedEngine's)."""
    with front_config(**overrides) as config:
        engine = PlayedEngine(config, plan=lambda submit: [], send_stats=send_stats, refused_fields=refused_fields)
        with FrontServer(config, tokenizer) as server, engine:
            under_test = FrontUnderTest(server, engine, tokenizer)
            under_test.set_plan(under_test.echo_plan)
            if send_stats:
                under_test.wait_healthy()
            yield under_test
