"""`detok engine --source vllm`: detok's engine process as vLLM's front-end client, reading the engine core's
per-step outputs directly (no API server, no gRPC hop).

The engine core is started and spoken to through vLLM's own client (`EngineCoreClient.make_async_mp_client`: its
wire format, handshake and process management stay vLLM's), configured from the same flags as `vllm serve`
(engine.vllm_args). One asyncio loop with two tasks:
- the bus: Submits become `EngineCoreRequest`s (vllm_requests.py) added to the engine core; a rid a worker
  stopped (stop string) or the client left is aborted on the engine core at once;
- the outputs: each `EngineCoreOutputs` (one engine step, every running request's new ids) is pushed into the
  EngineLink and sent on as one TokenBatch per worker: the engine step is the tick. Steps vLLM's client has queued
  already (the relay behind its engine core) go on together, up to MAX_COALESCED_STEPS in one TokenBatch per worker.
vLLM schedules: every Submit goes to the engine core at once, nothing is queued in detok. A slow client holds only
its own request (the front's per-request buffer aborts it past front.max_pending_chars).
The engine core dying ends every open request with an error naming it, then this process exits with an error: the
supervisor of `detok serve` stops the service (as `vllm serve` exits when its engine core dies), for the init
system or orchestrator to restart. Data parallel, any core's death is the engine's, as in vLLM's client; one on
another host (`--headless`) is not a process vLLM's client watches, so its connection closing is taken as its death.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

import vllm.envs as envs
import zmq
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.entrypoints.serve.utils.fingerprint import build_system_fingerprint
from vllm.renderers import renderer_from_config
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.engine import EngineCoreOutput, FinishReason
from vllm.v1.engine.core_client import AsyncMPClient, EngineCoreClient
from vllm.v1.engine.exceptions import EngineDeadError
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.executor import Executor
from vllm.version import __version__ as VLLM_VERSION

from detok_worker.bus.messages import AdapterCall, PromptCached, Submit
from detok_worker.config import DetokConfig
from detok_worker.engine.link import BLOCKED_RETRY_S, EngineLink
from detok_worker.engine.sources.base import RunOptions
from detok_worker.engine.stream_interval import StreamInterval
from detok_worker.engine.vllm_loras import LoraAdapters
from detok_worker.engine.vllm_requests import FINISHES, PromptRows, RequestBuilder, output_logprobs
from detok_worker.engine.vllm_stats import VllmStats
from detok_worker.engine.vllm_tool_grammar import ToolGrammar
from detok_worker.process.runtime import run_event_loop, stop_on_signals
from detok_worker.tokenizer import load_configured_tokenizer

log = logging.getLogger(__name__)

ENGINE_DIED = "the vLLM engine core died"
# Submits started per pass of the bus loop, at most this long (each goes through vLLM's input processing): a burst
# of thousands is taken in slices, the bus polled between them (worker heartbeats read, stats sent, steps taken)
SUBMIT_SLICE_S = 0.02
# Engine steps sent on as one TokenBatch per worker when vLLM's client has them queued already (a relay behind its
# engine core): their ids reach the workers, and the clients, in one batch and one chunk instead of one per step,
# which is what lets a relay that fell behind catch up. The bus loop still runs between such groups.
MAX_COALESCED_STEPS = 8


class VllmSource:
    def __init__(
        self,
        link: EngineLink,
        client: AsyncMPClient,
        requests: RequestBuilder,
        adapters: LoraAdapters,
        stream_interval: int = 1,
        stats: VllmStats | None = None,
    ) -> None:
        """`adapters`: the engine core's LoRA adapters (the table `requests` reads). `stream_interval`: vLLM's
        --stream-interval (ids sent on every this many; 1: each step's). `stats`: vLLM's metrics and stats log (None:
        --disable-log-stats)."""
        self.stats = stats
        self.link = link
        self.adapters = adapters
        link.lora_adapters = adapters.paths()
        self.adapter_calls: set[asyncio.Task[None]] = set()
        # None while neither the server nor a request asks for more than each step's ids
        self.interval = StreamInterval(stream_interval) if stream_interval > 1 else None
        self.client = client
        self.requests = requests
        self.on_engine: set[str] = set()  # rids added to the engine core and not ended there
        # rids that asked for prompt logprobs, until their prefill is done: the rows of its chunks so far
        self.prompt_rows: dict[str, PromptRows] = {}
        self.report_cached: set[str] = set()  # rids whose front waits for their cached prompt tokens
        self.stopping = False
        self.engine_dead = False
        self.bus = asyncio.Event()  # bus frames may have arrived

    def request_stop(self) -> None:
        self.stopping = True

    async def run(self) -> None:
        link = self.link
        endpoints = link.sockets.endpoints
        log.info("engine: vLLM engine core; submits at %s, workers at %s", endpoints.engine, endpoints.workers)
        loop = asyncio.get_running_loop()
        bus = self.bus
        fds = link.fds()
        for fd in fds:
            loop.add_reader(fd, bus.set)
        outputs = asyncio.create_task(self._read_outputs())
        connections = asyncio.create_task(self._watch_engine_connections())
        stats_log = asyncio.create_task(self.stats.log_periodically()) if self.stats is not None else None
        try:
            while not self.stopping and not outputs.done():
                news = link.poll(0)
                # before any await: the outputs task then skips them; finishes also hold workers' verdicts on requests
                # with stop strings that the engine ended
                if (news.stopped or news.finishes) and self.stats is not None:
                    self.stats.ended(news.stopped, news.finishes, news.delivered)
                # the stops before the submits: a stopped rid submitted again is a new request
                stopped = [rid for rid in news.stopped if rid in self.on_engine]
                if stopped:
                    self.on_engine.difference_update(stopped)
                    self._forget(stopped)
                    await self.client.abort_requests_async(stopped)
                slice_end = time.monotonic() + SUBMIT_SLICE_S
                for index, submit in enumerate(news.submitted):
                    if index and time.monotonic() >= slice_end:
                        link.defer(news.submitted[index:])
                        break
                    await self._start(submit)
                for call in news.adapter_calls:
                    task = asyncio.create_task(self._adapter_call(call))  # a load may take seconds: off the bus loop
                    self.adapter_calls.add(task)
                    task.add_done_callback(self.adapter_calls.discard)
                if link.scheduler.has_work():
                    link.step()
                if link.has_news():  # the sockets' FDs are edge-triggered: what one poll left is not signalled again
                    continue
                timer = loop.call_later(BLOCKED_RETRY_S if link.blocked else link.idle_wait_s(), bus.set)
                await bus.wait()
                timer.cancel()
                bus.clear()
        finally:
            tasks = [outputs, connections, *([stats_log] if stats_log is not None else [])]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for fd in fds:
                loop.remove_reader(fd)

    async def _adapter_call(self, call: AdapterCall) -> None:
        """Load or unload a LoRA adapter in the engine core (LoraAdapters), then answer the calling front."""
        answer = await self.adapters.call(call)
        self.link.lora_adapters = answer.lora_adapters
        self.link.answer(answer, call.front)
        self.bus.set()  # the answer went out on a bus socket: look again (see _read_outputs)

    async def _start(self, submit: Submit) -> None:
        if (accepted := self.link.accept_relayed(submit, partial(self.requests.build, submit))) is None:
            return
        detok, request = accepted
        self.on_engine.add(submit.rid)
        if self.stats is not None:
            arrival = submit.sent_ns / 1e9 if submit.sent_ns else time.time()
            self.stats.added(request, arrival, deferred=bool(detok.stop))
        if submit.params.sampling.prompt_logprobs is not None:
            self.prompt_rows[submit.rid] = PromptRows(submit.rid, self.link.config.bus.max_message_bytes)
        if submit.params.report_cached:
            self.report_cached.add(submit.rid)
        own_interval = submit.params.sampling.stream_interval
        if own_interval is not None and own_interval > 1:
            if self.interval is None:  # the server sends each step's ids
                self.interval = StreamInterval(1)
            self.interval.ask(submit.rid, own_interval)  # held where it is larger than the server's
        await self.client.add_request_async(request)

    async def _read_outputs(self) -> None:
        link = self.link
        client = self.client
        on_engine = self.on_engine
        prompt_rows = self.prompt_rows
        report_cached = self.report_cached
        queued = client.outputs_queue
        coalesced = 0
        gone: list[str] = []
        while True:
            try:
                step = await client.get_output_async()
            except EngineDeadError:
                self._engine_died()
                return
            gone_before = len(gone)
            for output in step.outputs:
                rid = output.request_id
                reason = output.finish_reason
                if prompt_rows and rid in prompt_rows:
                    self._prompt_logprobs(output)
                if report_cached and rid in report_cached and (output.new_token_ids or output.finish_reason):
                    report_cached.discard(rid)  # the prefill is done: its stats say what the prefix cache held
                    stats = output.prefill_stats
                    cached = (stats.num_cached_tokens, stats.num_cache_creation_tokens) if stats is not None else (0, 0)
                    link.send_prompt_info(PromptCached(rid, *cached))
                if reason is None:
                    finish = None
                else:
                    on_engine.discard(rid)
                    finish = FINISHES.get(reason)
                    if finish is None:
                        if reason != FinishReason.ABORT:  # an abort is ours (stop string, client gone)
                            link.step()  # the ids of the steps held so far go first
                            link.fail(rid, f"the vLLM engine core ended the request: {reason}")
                        self._forget([rid])
                        continue
                ids = output.new_token_ids
                logprobs = output_logprobs(output) if output.new_logprobs is not None else None
                if self.interval is not None:
                    taken = self.interval.take(rid, ids, logprobs, finish is not None)
                    if taken is None:
                        continue
                    ids, logprobs = taken
                if not link.push(rid, ids, finish, logprobs) and finish is None and rid in on_engine:
                    on_engine.discard(rid)
                    gone.append(rid)
            if self.stats is not None:
                if len(gone) > gone_before:  # ended in detok: counted when their end came, unless detok failed them
                    self.stats.ended(gone[gone_before:], {})
                self.stats.step(step)
            if queued.qsize() and coalesced < MAX_COALESCED_STEPS - 1:
                coalesced += 1  # the next step's ids join this one's in the workers' batches
                continue
            coalesced = 0
            link.step()
            # the step used the bus sockets, which can take the edge off their file descriptors: the bus loop
            # looks again rather than wait for a signal that may not come
            self.bus.set()
            if gone:  # ended in detok meanwhile (its worker saw a stop token or string first)
                self._forget(gone)
                await client.abort_requests_async(gone)
                gone = []
            # vLLM's client hands out queued steps without suspending: a relay behind its engine core (short of CPU,
            # or at a rate it cannot keep) would read steps back to back and starve the bus loop of Submits, Aborts
            # and worker heartbeats until it caught up. One bus pass per group of steps
            await asyncio.sleep(0)

    def _forget(self, rids: list[str]) -> None:
        """What this source holds of requests that left the engine: their prompt logprobs so far and the ids their
        stream interval held back."""
        for rid in rids:
            self.prompt_rows.pop(rid, None)
            self.report_cached.discard(rid)
            if self.interval is not None:
                self.interval.forget(rid)

    def _prompt_logprobs(self, output: EngineCoreOutput) -> None:
        """Collect a request's prompt logprobs over its prefill chunks; send them to its front once the prefill is
        done (its first id, or its end), also when there are none (a one-token prompt): the front waits for them."""
        rid = output.request_id
        rows = self.prompt_rows[rid]
        if output.new_prompt_logprobs_tensors is not None:
            rows.add(output.new_prompt_logprobs_tensors)
        if output.new_token_ids or output.finish_reason is not None:
            del self.prompt_rows[rid]
            if rows.too_large:  # the client's k for this prompt: its push then finds the rid ended
                message = "the prompt logprobs asked for are larger than the bus carries (bus.max_message_bytes)"
                self.link.fail(rid, message, param="prompt_logprobs")
            elif output.finish_reason != FinishReason.ABORT:
                self.link.send_prompt_info(rows.message())

    async def _watch_engine_connections(self) -> None:
        """An engine core's connection to the client's request socket closing (its process gone, on this host or
        another) is the engine's death. vLLM's client watches the processes it started, not a headless core on
        another host, whose requests would otherwise wait for ever."""
        requests_socket = self.client.input_socket
        monitor = requests_socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            await monitor.recv_multipart()
        finally:
            requests_socket.disable_monitor()
            monitor.close(linger=0)
        if not self.stopping:
            log.error("engine: an engine core's connection closed")
            self._engine_died()
            self.bus.set()

    def _engine_died(self) -> None:
        """Every open request ends with an error naming the engine; then this process stops (see the module doc)."""
        if self.engine_dead:
            return
        self.engine_dead = True
        link = self.link
        link.step()  # the steps held so far (requests the engine core finished among them) go first
        rids = link.scheduler.list_live_rids()
        log.error("engine: %s; failing its %d open request(s)", ENGINE_DIED, len(rids))
        for rid in rids:
            link.fail(rid, f"{ENGINE_DIED}: the request cannot finish")
        link.step()
        self.stopping = True


def log_vllm_through_detok() -> None:
    """From now on vLLM's log records of this process (its stats line among them) go to this process's log, in
    detok's format, instead of vLLM's own handler on stdout. Called once the engine core runs: its process keeps
    vLLM's logging as vLLM sets it up."""
    vllm_logger = logging.getLogger("vllm")
    for handler in list(vllm_logger.handlers):
        vllm_logger.removeHandler(handler)
    vllm_logger.propagate = True


def run_vllm_source(config: DetokConfig, options: RunOptions) -> int:
    """Start vLLM's engine core from engine.model and engine.vllm_args, serve the bus until SIGINT/SIGTERM or the
    engine core's death (exit code 1)."""
    engine = config.engine
    started = time.monotonic()
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", engine.model, *engine.vllm_args])
    vllm_config = AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    model_config = vllm_config.model_config
    tokenizer = load_configured_tokenizer(config)
    generation = model_config.try_get_generation_config()
    eos = generation.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [] if eos is None else [eos]  # the generation config's

    async def main() -> int:
        log_stats = not args.disable_log_stats
        client = EngineCoreClient.make_async_mp_client(
            vllm_config, Executor.get_class(vllm_config), log_stats=log_stats
        )
        log_vllm_through_detok()
        # vLLM's environment variables read once from here on, as its engine core does once it runs: vLLM's stat
        # classes look one up for every request output of every step
        envs.enable_envs_cache()
        try:
            adapters = LoraAdapters(client, args.served_model_name or [model_config.served_model_name])
            await adapters.load_static(args.lora_modules)
            processor = InputProcessor(vllm_config, renderer_from_config(vllm_config))
            tool_grammar = ToolGrammar.from_args(args, model_config, processor.tokenizer)
            requests = RequestBuilder(processor, model_config, adapters.requests, tool_grammar)
            link = EngineLink(
                config,
                tokenizer,
                eos_ids=eos_ids,
                vocab_size=model_config.get_vocab_size(),
                served_model_name=model_config.served_model_name,
                engine_version=VLLM_VERSION,
                system_fingerprint=build_system_fingerprint(vllm_config, args.fingerprint_mode, args.fingerprint_value)
                or "",
                max_model_len=model_config.max_model_len,
                refused_fields=(),  # vLLM's engine core takes every request field
                sampling_defaults=requests.numeric_defaults(),
            )
            log.info(
                "engine: vLLM engine core for %s (served as %s) ready in %.1f s",
                model_config.model,
                model_config.served_model_name,
                time.monotonic() - started,
            )
            stats = VllmStats(vllm_config, client.engine_ranks_managed) if log_stats else None
            interval = vllm_config.scheduler_config.stream_interval
            source = VllmSource(link, client, requests, adapters, interval, stats)
            try:
                with stop_on_signals(source.request_stop):
                    await source.run()
            finally:
                link.close()
            return 1 if source.engine_dead else 0
        finally:
            client.shutdown()

    return run_event_loop(main())
