"""`detok engine-server`: detok's local token sources (corpus, echo, trace, llama-cpp) served as a real gRPC
`VllmEngine` (SMG's token-only API, the one `vllm serve --grpc` speaks), for tests and benches of gRPC gateways
(detok's own and SMG).

Generate streams the source's ids for the request, tokens_per_step per chunk, one chunk per engine.step_interval_ms
(0 = as fast as possible; a paced trace keeps its recorded timing), then a GenerateComplete with every output id. A
request that asks for logprobs gets the planning sources' deterministic fake ones (`fake_logprobs`) in each chunk's
and the GenerateComplete's output_logprobs. Like an engine it stops at its stop ids (EOS unless ignore_eos, plus the
request's stop_token_ids, none before min_tokens) and at max_tokens. A generating source (llama-cpp) makes the ids
as they are streamed: one GeneratorEngine for all requests, stepped in a thread so the server stays responsive; each
step's ids go out as one chunk per request. Abort (and a cancelled stream) stops a request (a generation is
cancelled at once). Counts go to the log at exit and, with --stats-file, to a JSON file rewritten every 0.1 s while
they change: requests, completed, cancelled (streams the client dropped), aborted (Abort naming a request that was
running, or whose stream the client had just cancelled), abort_calls, generated (ids a generating source made),
cancelled_starts (Generate calls ended with CANCELLED at once: --cancel-starts N, a fault for the gateway's
retries). With --requests-log, one JSON line per ended request: {"rid", "prompt_ids", "ids" (every id streamed),
"finish"}: a bench checks a gateway's text against the decode of exactly what the engine sent.
GetModelInfo reports the tokenizer directory as model_path (SMG loads its tokenizer from there); GetTokenizer
serves that directory's files as a zip (a tokenizer given as a file, a GGUF, alone and uncompressed: its
quantized weights would take seconds to deflate for nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import io
import json
import logging
import os
import signal
import time
import zipfile
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.json_format import MessageToDict
from smg_grpc_proto import vllm_engine_pb2 as pb2
from smg_grpc_proto import vllm_engine_pb2_grpc as pb2_grpc
from smg_grpc_proto.generated import common_pb2

from detok_worker.bus.messages import (
    FINISH_ABORT,
    FINISH_ERROR,
    FINISH_LENGTH,
    FINISH_STOP,
    MAX_TOP_LOGPROBS,
    DetokParams,
    RequestParams,
    TokenLogprob,
)
from detok_worker.config import DetokConfig
from detok_worker.process.runtime import run_event_loop
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.loading.factory import DEFAULT_TOKENIZER_DIR
from detok_worker.tokenizer.protocol import Tokenizer
from engine_stub.fake_logprobs import fake_logprobs
from engine_stub.generators import GeneratingSource, GeneratorEngine
from engine_stub.local import create_local_source
from engine_stub.planned import TokenSource

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 4096  # a request without max_tokens
STATS_INTERVAL_S = 0.1
ZIP_CHUNK = 1 << 20
DROPPED_KEPT = 10_000


def cut_at_stop(ids: list[int], params: RequestParams, stop_ids: set[int]) -> tuple[list[int], str]:
    """(output ids, finish reason) of a plan under the engine's own stop rules."""
    for index in range(params.detok.min_tokens, min(len(ids), params.max_tokens)):
        if ids[index] in stop_ids:
            return ids[: index + 1], FINISH_STOP
    if len(ids) > params.max_tokens:
        return ids[: params.max_tokens], FINISH_LENGTH
    return ids, FINISH_STOP


# The gRPC engine server's generating source (llama-cpp): the requests of every Generate stream in one
# GeneratorEngine, stepped by one asyncio task. A step runs in a worker thread (llama.cpp releases the GIL while it
# decodes), so Abort, new streams and other clients are served meanwhile; requests are added and cancelled only
# between steps, on the event loop, so the engine is never touched from two threads at once.

# one step's news for a stream: (new ids, finish or None, error or None)
StepNews = tuple[list[int], str | None, str | None]
# what a Generate stream sends of one step: (new ids, finish or None, their logprobs or None)
Step = tuple[list[int], str | None, list[TokenLogprob] | None]


@dataclass(slots=True)
class Generation:
    rid: str
    request: tuple[list[int], int, list[int], int]  # GeneratorEngine.add: prompt ids, max_tokens, stop ids, min_tokens
    steps: asyncio.Queue[StepNews] = field(default_factory=asyncio.Queue)


class GenerationRuns:
    def __init__(self, source: GeneratingSource, tokens_per_step: int, step_s: float) -> None:
        self.engine = GeneratorEngine(source.generate, tokens_per_step, source.max_running)
        self.step_s = step_s
        self.live: dict[str, Generation] = {}
        self._adds: list[Generation] = []
        self._cancels: list[str] = []
        self._task: asyncio.Task[None] | None = None

    def submit(self, generation: Generation) -> None:
        """Start generating at the next step; its news arrive on generation.steps (a request the source cannot
        serve gets one item with the error and no finish)."""
        self._adds.append(generation)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self, rid: str, *, notify: bool = False) -> None:
        """Stop generating `rid` (before the next step); with notify its stream gets a last "abort" item."""
        generation = self.live.pop(rid, None) or next((g for g in self._adds if g.rid == rid), None)
        if generation is None:
            return
        self._cancels.append(rid)
        if notify:
            generation.steps.put_nowait(([], FINISH_ABORT, None))

    async def _run(self) -> None:
        try:
            while True:
                self._apply()
                if not self.engine.has_work():
                    return
                for rid, ids, finish in await asyncio.to_thread(self.engine.step):
                    self._report(rid, ids, finish)
                if self.step_s:
                    await asyncio.sleep(self.step_s)
        finally:
            self._task = None

    def _apply(self) -> None:
        adds, self._adds = self._adds, []
        for generation in adds:
            try:
                self.engine.add(generation.rid, *generation.request)
            except ValueError as exc:
                generation.steps.put_nowait(([], None, f"the engine's token source failed: {exc}"))
                continue
            self.live[generation.rid] = generation
        cancels, self._cancels = self._cancels, []
        for rid in cancels:
            self.live.pop(rid, None)
            self.engine.cancel(rid)

    def _report(self, rid: str, ids: list[int], finish: str | None) -> None:
        generation = self.live.get(rid)
        if generation is None:
            return  # cancelled while the step ran
        error = self.engine.errors.pop(rid, "generation failed") if finish == FINISH_ERROR else None
        generation.steps.put_nowait((ids, finish, error))
        if finish is not None:
            del self.live[rid]


def proto_logprobs(entries: list[TokenLogprob]) -> Any:
    """Bus logprob entries as the engine's OutputLogProbs (the planning sources' fake ones: `fake_logprobs`)."""
    return pb2.OutputLogProbs(
        token_logprobs=[entry.logprob for entry in entries],
        top_logprobs=[pb2.TopLogProbs(values=entry.top_logprobs, token_ids=entry.top_ids) for entry in entries],
    )


class StubEngineServicer(pb2_grpc.VllmEngineServicer):
    def __init__(
        self,
        config: DetokConfig,
        tokenizer: Tokenizer,
        source: TokenSource | GeneratingSource,
        requests_log: TextIO | None = None,
        cancel_starts: int = 0,
    ) -> None:
        engine = config.engine
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.step_s = engine.step_interval_ms / 1000.0
        self.tokens_per_step = engine.tokens_per_step
        self.planner: TokenSource | None = None
        self.runs: GenerationRuns | None = None
        if isinstance(source, GeneratingSource):
            self.eos_ids |= source.eos_ids
            self.runs = GenerationRuns(source, engine.tokens_per_step, self.step_s)
        else:
            self.planner = source
        path = Path(config.tokenizer.path) if config.tokenizer.path else DEFAULT_TOKENIZER_DIR
        self.model_dir = (path if path.is_dir() else path.parent).resolve()
        # a tokenizer file (a GGUF) is served alone, not with whatever else lies in its directory
        self.tokenizer_files = [path] if path.is_file() else sorted(self.model_dir.iterdir())
        self.model_name = config.front.model_name or self.model_dir.name
        self.running: set[str] = set()
        self.aborting: set[str] = set()
        self.dropped: dict[str, None] = {}  # rids whose stream the client cancelled (recent ones), oldest first
        self.counts: Counter[str] = Counter()
        self.requests_log = requests_log
        self.last_sampling: dict[str, Any] = {}
        self.cancel_starts = cancel_starts  # Generate calls still to be ended with CANCELLED (--cancel-starts)

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802 - the gRPC method
        rid = request.request_id
        if self.cancel_starts > 0:
            self.cancel_starts -= 1
            self.counts["cancelled_starts"] += 1
            await context.abort(grpc.StatusCode.CANCELLED, "cancelled at start (--cancel-starts)")
        sampling = request.sampling_params
        asked = sampling.logprobs if sampling.HasField("logprobs") else None
        if asked is not None and asked > MAX_TOP_LOGPROBS:  # as vLLM's max_logprobs; its fake ones cost O(asked)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"logprobs must be at most {MAX_TOP_LOGPROBS}, got {asked}"
            )
        params = RequestParams(
            max_tokens=sampling.max_tokens if sampling.HasField("max_tokens") else DEFAULT_MAX_TOKENS,
            detok=DetokParams(stop_token_ids=list(sampling.stop_token_ids), min_tokens=sampling.min_tokens),
            ignore_eos=sampling.ignore_eos,
        )
        prompt_ids = list(request.tokenized.input_ids)
        stop_ids = set(params.detok.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_ids))
        if self.runs is not None:
            steps = self._generated(rid, prompt_ids, params, stop_ids, self.runs, context)
        else:
            steps = self._planned(rid, prompt_ids, params, stop_ids, asked)
        self.counts["requests"] += 1
        # what the gateway asked for beyond the ids (sampling, constraint): the stub cannot honour it, tests read it
        self.last_sampling = MessageToDict(sampling, preserving_proto_field_name=True)
        self.running.add(rid)
        output: list[int] = []
        logprobs: list[TokenLogprob] = []
        finish: str | None = None
        done = False
        try:
            async for step in steps:
                ids, finish, step_logprobs = step
                if not ids:
                    continue
                output += ids
                chunk = pb2.GenerateStreamChunk(
                    token_ids=ids, prompt_tokens=len(prompt_ids), completion_tokens=len(output)
                )
                if step_logprobs is not None:
                    logprobs += step_logprobs
                    chunk.output_logprobs.CopyFrom(proto_logprobs(step_logprobs))
                yield pb2.GenerateResponse(chunk=chunk)
            aborted = finish == FINISH_ABORT
            complete = pb2.GenerateComplete(
                output_ids=[] if aborted else output,
                finish_reason=finish,
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(output),
            )
            if finish == "stop" and len(output) > params.detok.min_tokens and output[-1] in stop_ids:
                complete.matched_token_id = output[-1]
            if logprobs and not aborted:
                complete.output_logprobs.CopyFrom(proto_logprobs(logprobs))
            # counted before the last message goes out: a client may cancel its call once it has that message,
            # and the generator is not resumed after the yield then
            done = True
            self.counts["aborted_streams" if aborted else "completed"] += 1
            yield pb2.GenerateResponse(complete=complete)
        finally:
            if self.runs is not None:
                self.runs.cancel(rid)
            self._ended(rid, prompt_ids, output, finish if done else None)

    async def _planned(
        self, rid: str, prompt_ids: list[int], params: RequestParams, stop_ids: set[int], asked: int | None
    ) -> AsyncIterator[Step]:
        """A planning source's ids, cut at the engine's own stops, tokens_per_step per chunk: one chunk per
        engine.step_interval_ms, or paced as the plan says; fake logprobs (`fake_logprobs`) when asked."""
        assert self.planner is not None
        plan = self.planner.plan(rid, prompt_ids, params)
        ids, finish = cut_at_stop(plan.ids, params, stop_ids)
        logprobs = fake_logprobs(ids, max(asked, 0), self.tokenizer) if asked is not None else None
        started = time.monotonic()
        for start in range(0, len(ids), self.tokens_per_step):
            if rid in self.aborting:
                yield [], FINISH_ABORT, None
                return
            end = min(start + self.tokens_per_step, len(ids))
            if plan.offsets_ns is not None:
                await asyncio.sleep(max(0.0, started + plan.offsets_ns[end - 1] / 1e9 - time.monotonic()))
            elif self.step_s and start:
                await asyncio.sleep(self.step_s)
            yield ids[start:end], None, None if logprobs is None else logprobs[start:end]
        yield [], finish, None

    async def _generated(
        self,
        rid: str,
        prompt_ids: list[int],
        params: RequestParams,
        stop_ids: set[int],
        runs: GenerationRuns,
        context: Any,
    ) -> AsyncIterator[Step]:
        """A generating source's ids: each step's new ids are one chunk."""
        generation = Generation(rid, (prompt_ids, params.max_tokens, sorted(stop_ids), params.detok.min_tokens))
        runs.submit(generation)
        while True:
            ids, finish, error = await generation.steps.get()
            if error is not None:  # refused before any work, or failed while generating
                code = grpc.StatusCode.INTERNAL if finish == FINISH_ERROR else grpc.StatusCode.INVALID_ARGUMENT
                await context.abort(code, error)
            self.counts["generated"] += len(ids)
            yield ids, finish, None
            if finish is not None:
                return

    def _ended(self, rid: str, prompt_ids: list[int], ids: list[int], finish: str | None) -> None:
        """A Generate stream is over: finish None when the client dropped it."""
        if self.requests_log is not None:
            record = {"rid": rid, "prompt_ids": prompt_ids, "ids": ids, "finish": finish}
            self.requests_log.write(json.dumps(record) + "\n")
        if finish is None:
            self.counts["cancelled"] += 1  # the client dropped the stream
            self.dropped[rid] = None
            if len(self.dropped) > DROPPED_KEPT:
                del self.dropped[next(iter(self.dropped))]
        self.running.discard(rid)
        self.aborting.discard(rid)

    async def Abort(self, request: Any, context: Any) -> Any:  # noqa: N802
        for rid in request.request_ids:
            self.counts["abort_calls"] += 1
            if rid in self.running:
                self.counts["aborted"] += 1
                self.aborting.add(rid)
                if self.runs is not None:
                    self.runs.cancel(rid, notify=True)
            elif self.dropped.pop(rid, 0) is None:  # the client cancelled the stream just before: still an abort
                self.counts["aborted"] += 1
        return pb2.AbortResponse()

    async def HealthCheck(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb2.HealthCheckResponse(healthy=True, message="ok")

    async def GetModelInfo(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb2.GetModelInfoResponse(
            model_path=str(self.model_dir),
            tokenizer_path=str(self.model_dir),
            served_model_name=self.model_name,
            is_generation=True,
            vocab_size=self.tokenizer.vocab_size,
            max_context_length=1 << 20,
            eos_token_ids=sorted(self.eos_ids),
        )

    async def GetTokenizer(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in self.tokenizer_files:
                if file.is_file():
                    archive.write(file, file.name, zipfile.ZIP_STORED if file.suffix == ".gguf" else None)
        data = buffer.getvalue()
        digest = hashlib.sha256(data).hexdigest()
        for start in range(0, len(data), ZIP_CHUNK):
            last = start + ZIP_CHUNK >= len(data)
            yield common_pb2.GetTokenizerChunk(data=data[start : start + ZIP_CHUNK], sha256=digest if last else "")

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "running": len(self.running), "last_sampling": self.last_sampling}


async def serve_engine(
    config: DetokConfig,
    listen: str,
    stats_file: str | None = None,
    requests_log: str | None = None,
    cancel_starts: int = 0,
) -> None:
    tokenizer = load_configured_tokenizer(config)
    with contextlib.ExitStack() as files:
        log_file = files.enter_context(open(requests_log, "a", buffering=1)) if requests_log else None
        source = create_local_source(config, tokenizer)
        servicer = StubEngineServicer(config, tokenizer, source, log_file, cancel_starts)
        await _serve(servicer, listen, stats_file)


async def _serve(servicer: StubEngineServicer, listen: str, stats_file: str | None) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb2_grpc.add_VllmEngineServicer_to_server(servicer, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    host = listen.rsplit(":", 1)[0]
    print(f"engine server listening on grpc://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    written: dict[str, Any] | None = None
    while not stop.is_set():
        if stats_file and (stats := servicer.stats()) != written:
            write_stats(stats_file, stats)
            written = stats
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), STATS_INTERVAL_S)
    await server.stop(grace=1.0)
    if stats_file:
        write_stats(stats_file, servicer.stats())
    log.info("engine server: %s", json.dumps(servicer.stats(), sort_keys=True))


def write_stats(path: str, stats: dict[str, Any]) -> None:
    temporary = f"{path}.tmp"
    Path(temporary).write_text(json.dumps(stats, sort_keys=True))
    os.replace(temporary, path)


def run_engine_server(args: argparse.Namespace, config: DetokConfig) -> int:
    run_event_loop(serve_engine(config, args.listen, args.stats_file, args.requests_log, args.cancel_starts))
    return 0
