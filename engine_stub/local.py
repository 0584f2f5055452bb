"""The local sources' loop (corpus, echo, trace, llama-cpp): an engine running in this process on top of the engine
side of the bus (`EngineLink`), stepping every engine.step_interval_ms, plus the replay of a trace's
own requests at their recorded times. It is the loop of docs/protocol.md section 5, as a real engine's relay runs
it: every request is accepted by the link at its Submit, and each step pushes the new ids of every running request.
A planning source's plans run through a PlannedEngine (max_batch at once, tokens_per_step per step or
paced as recorded, fake logprobs when asked), a generating source (a real model) through a GeneratorEngine.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from detok_worker.bus.messages import FINISH_ERROR, FINISH_STOP, Submit
from detok_worker.config import DetokConfig
from detok_worker.engine.front_channel import BusNews
from detok_worker.engine.link import EngineLink
from detok_worker.engine.sources.base import RunOptions, SourceError
from detok_worker.process.runtime import stop_on_signals
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import RecordedRequest, Trace, read_trace
from engine_stub import planned
from engine_stub.fake_logprobs import fake_logprobs
from engine_stub.generators import GeneratingSource, GeneratorEngine
from engine_stub.planned import PlannedEngine, TokenSource, passage_ids

log = logging.getLogger(__name__)

BAD_SOURCE = "source_error"  # a request the source could not plan or generate (counted with the bad frames)
MAX_POLL_MS = 100
MIN_IDLE_WAIT_NS = 1_000_000
BLOCKED_RETRY_NS = 5_000_000


class ReplayFeed:
    """Feeds a trace's requests into the scheduler at their recorded times (scaled by speed; 0 = all at once).
    The clock starts when the first worker is alive, so early requests are not rejected."""

    def __init__(self, trace: Trace, speed: float) -> None:
        self.requests = deque(sorted(trace.requests, key=lambda r: r.t_ns))
        self.speed = speed
        self.base_ns = self.requests[0].t_ns if self.requests else 0
        self.start_ns: int | None = None

    @property
    def done(self) -> bool:
        return not self.requests

    def due(self, now_ns: int) -> list[RecordedRequest]:
        if self.start_ns is None:
            self.start_ns = now_ns
        due = []
        while self.requests and (self.speed == 0 or self.at(self.requests[0].t_ns) <= now_ns):
            due.append(self.requests.popleft())
        return due

    def next_arrival_ns(self) -> int | None:
        """When the next request is due (monotonic ns); None before the clock started or when all are in."""
        if self.start_ns is None or not self.requests:
            return None
        return self.start_ns if self.speed == 0 else self.at(self.requests[0].t_ns)

    def at(self, t_ns: int) -> int:
        assert self.start_ns is not None
        return self.start_ns + int((t_ns - self.base_ns) / self.speed)

    def release_times(self, request: RecordedRequest) -> list[int] | None:
        return None if self.speed == 0 else [self.at(t) for t in request.token_times_ns]


class EngineProcess:
    def __init__(
        self,
        config: DetokConfig,
        tokenizer: Tokenizer,
        source: TokenSource | GeneratingSource,
        *,
        replay: Trace | None = None,
        exit_after_replay: bool = False,
    ) -> None:
        engine = config.engine
        self.tokenizer = tokenizer
        self.planner: TokenSource | None = None
        self.generator: GeneratorEngine | None = None
        if isinstance(source, GeneratingSource):
            running = min(source.max_running, engine.max_batch)
            self.generator = GeneratorEngine(source.generate, engine.tokens_per_step, running)
        else:
            self.planner = source
        self.plans = PlannedEngine(engine.max_batch, engine.tokens_per_step)  # the planner's and the replay's
        eos_ids = source.eos_ids if isinstance(source, GeneratingSource) else ()
        self.link = EngineLink(config, tokenizer, eos_ids=eos_ids)
        self.scheduler = self.link.scheduler
        self.replay = ReplayFeed(replay, engine.replay_speed) if replay is not None else None
        self.exit_after_replay = exit_after_replay
        self.step_interval_s = engine.step_interval_ms / 1000.0
        self.stopping = False
        self._next_step = time.monotonic()
        self._idle_step = False  # the last step emitted nothing: wait for news instead of spinning

    def request_stop(self) -> None:
        self.stopping = True

    def run(self) -> None:
        endpoints = self.link.sockets.endpoints
        log.info("engine: submits at %s, workers at %s", endpoints.engine, endpoints.workers)
        try:
            while not self.stopping:
                self.take_news(self.link.poll(self._poll_timeout_ms() / 1000))
                self._feed_replay()
                now = time.monotonic()
                if now >= self._next_step and self._has_work():
                    generating = self._generate()
                    self._idle_step = self.link.step() == 0 and not generating
                    self._next_step = now + self.step_interval_s
                if self._replay_finished():
                    break
        finally:
            self.link.close()

    def take_news(self, news: BusNews) -> None:
        """A poll's stopped rids, then its submits: a stopped rid submitted again in the same poll is a new request."""
        for rid in news.stopped:
            self._cancel(rid)
        for submit in news.submitted:
            self._submit(submit)

    def _replay_finished(self) -> bool:
        replay = self.replay
        return self.exit_after_replay and replay is not None and replay.done and not self._has_work()

    def _has_work(self) -> bool:
        generator = self.generator
        return self.scheduler.has_work() or self.plans.has_work() or (generator is not None and generator.has_work())

    def _cancel(self, rid: str) -> None:
        self.plans.cancel(rid)
        if self.generator is not None:
            self.generator.cancel(rid)

    def _generate(self) -> bool:
        """One step of the engines, their ids pushed to the link; False when the generating source had nothing to
        do (planned ids cost no work: a step that sends none of them is idle)."""
        link = self.link
        scheduler = self.scheduler
        backlog = None if scheduler.all_sent() else scheduler.backlog
        for rid in link.push_all(self.plans.step(time.monotonic_ns(), backlog)):
            self.plans.cancel(rid)  # no longer generating: stopped or ended meanwhile
        generator = self.generator
        if generator is None or not generator.has_work():
            return False
        for rid, ids, finish in generator.step():
            if finish == FINISH_ERROR:
                link.fail(rid, generator.errors.pop(rid, "generation failed"))
            elif not link.push(rid, ids, finish):
                generator.cancel(rid)
        return True

    def _submit(self, message: Submit) -> None:
        detok = self.link.accept(message)
        if detok is None:
            return
        rid, params = message.rid, message.params
        try:
            if self.generator is not None:
                self.generator.add(rid, message.prompt_ids, params.max_tokens, detok.stop_token_ids, detok.min_tokens)
                return
            assert self.planner is not None
            plan = self.planner.plan(rid, message.prompt_ids, params)
        except Exception as exc:  # noqa: BLE001 - a source failure (a model that cannot take it) fails this request only
            self.link.decoder.count_bad(BAD_SOURCE, exc)
            self.link.fail(rid, f"the engine's token source failed: {exc}")
            return
        release = None
        if plan.offsets_ns is not None:
            now_ns = time.monotonic_ns()
            release = [now_ns + offset for offset in plan.offsets_ns]
        self._plan(message, plan.ids, release)

    def _plan(self, message: Submit, ids: list[int], release_ns: list[int] | None, finish: str | None = None) -> None:
        """Generate `ids` for an accepted request (with fake logprobs, `fake_logprobs`, when it asked for them)."""
        params = message.params
        top = params.sampling.logprobs
        logprobs = None if top is None else fake_logprobs(ids[: params.max_tokens], top, self.tokenizer)
        self.plans.add(message.rid, ids, params.max_tokens, finish=finish, release_ns=release_ns, logprobs=logprobs)

    def _feed_replay(self) -> None:
        if self.replay is None or self.replay.done or not self.scheduler.live_workers():
            return
        for request in self.replay.due(time.monotonic_ns()):
            submit = Submit(request.rid, request.prompt_ids, request.params)
            if self.link.accept(submit) is not None:
                release = self.replay.release_times(request)
                self._plan(submit, request.output_ids, release, request.finish or FINISH_STOP)

    def _poll_timeout_ms(self) -> int:
        """Sleep until the next step, stats or replay arrival; after a step that could emit nothing (paced ids
        not due, worker queues full, no worker) wait for news or the next paced id instead of spinning."""
        now_ns = time.monotonic_ns()
        deadline_ns = int(self.link.next_stats * 1e9)
        if self._has_work():
            if self._idle_step:
                release = self.plans.next_release_ns()
                wait_ns = MAX_POLL_MS * 1_000_000 if release is None else release - now_ns
                if self.link.blocked:  # a worker's queue was full: ZeroMQ cannot tell when it drains, so retry soon
                    wait_ns = min(wait_ns, BLOCKED_RETRY_NS)
                deadline_ns = min(deadline_ns, now_ns + max(MIN_IDLE_WAIT_NS, wait_ns))
            else:
                deadline_ns = min(deadline_ns, int(self._next_step * 1e9))
        if self.replay is not None and (arrival := self.replay.next_arrival_ns()) is not None:
            deadline_ns = min(deadline_ns, arrival)
        return max(0, min(MAX_POLL_MS, -(-(deadline_ns - now_ns) // 1_000_000)))


def create_local_source(config: DetokConfig, tokenizer: Tokenizer) -> TokenSource | GeneratingSource:
    """The token source of a local engine.source (this loop's, and the gRPC engine server's)."""
    engine = config.engine
    eos_id = planned.primary_eos_id(tokenizer)
    if engine.source == "echo":
        return planned.EchoSource(eos_id)
    if engine.source == "trace":
        return planned.TraceSource(read_trace(engine.trace), engine.replay_speed)
    if engine.source == "llama-cpp":
        from engine_stub.llama import LlamaGenerator, LlamaSource, default_model_path

        generator = LlamaGenerator(engine.model or default_model_path(), engine.model_threads)
        return LlamaSource(generator, tokenizer)
    if engine.source != "corpus":
        raise SourceError(f"engine.source {engine.source!r} is not a local token source")
    passages = planned.load_corpus(engine.corpus or None)
    return planned.CorpusSource(tokenizer, passages, eos_id, engine.seed, passage_ids(tokenizer, passages))


def run_local(config: DetokConfig, options: RunOptions) -> int:
    """Run the configured local source until SIGINT/SIGTERM. With options.replay (a trace file) the trace's own
    requests are generated at their recorded times (engine.replay_speed) in addition to any Submits from a front;
    with exit_after_replay the engine returns once they have all ended."""
    tokenizer = load_configured_tokenizer(config)
    source = create_local_source(config, tokenizer)
    trace = read_trace(options.replay) if options.replay is not None else None
    process = EngineProcess(config, tokenizer, source, replay=trace, exit_after_replay=options.exit_after_replay)
    with stop_on_signals(process.request_stop):
        process.run()
    return 0
