"""vLLM's metrics and its periodic stats log line from the vLLM source, through vLLM's own classes: the engine core
runs with stats on (unless `--disable-log-stats`), each engine step's scheduler stats and its outputs go into vLLM's
`IterationStats` / `RequestStateStats` as vLLM's output processor puts them there (`vllm/v1/engine/
output_processor.py`, `async_llm.py`), and vLLM's `StatLoggerManager` (its `PrometheusStatLogger` and
`LoggingStatLogger`) records them. So the `vllm:*` families have vLLM's names, types, labels and buckets for the
installed vLLM. In `detok serve` every process writes its Prometheus values to the shared multiprocess directory, so
the front's /metrics shows these beside detok's own families.

How a request's end counts, as in vLLM's own front end:
- the engine core ends it (EOS, max_tokens, a stop token, its own abort or error): that finish reason;
- a worker finds a stop string (vLLM's own output processor would have): "stop", with the ids the worker kept
  (Finish.n_tokens). The engine generates on until that Finish reaches it, and vLLM never counts a request's ids past
  its stop, so the ids of a request with stop strings go to `vllm:generation_tokens` when it ends (at most as many as
  it kept): a counter cannot take back what it counted early. The engine may end such a request before that Finish
  reaches it (its last ids, or a stop string the worker finds in them): it waits for the worker's verdict (a Finish
  sent for every request with stop strings that the engine ends), VERDICT_WAIT_S at most (a worker lost meanwhile);
- its client goes away (an abort): vLLM forgets the request, so it is no finished request (no `request_success`, no
  latency histograms); the ids it got so far count as generated.

Work is per engine step and per request output, as in vLLM's own front end. vLLM observes one inter-token latency
per output of each step; in prometheus_client's multiprocess mode (detok's) each observation is a write to a
memory-mapped file, so vLLM's histograms are made here as `StepHistogram`s: vLLM's own PrometheusStatLogger defines
them (names, labels, buckets), their observations are counted in plain numbers and written once per step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import ClassVar

import vllm.envs as envs
from prometheus_client import Histogram
from vllm.config import VllmConfig
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vllm.v1.engine.parallel_sampling import ParentRequest
from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerManager
from vllm.v1.metrics.stats import IterationStats, LoRARequestStates, RequestStateStats

from detok_worker.bus.messages import FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, Finish

log = logging.getLogger(__name__)

# how long a request with stop strings that the engine ended waits for its worker's verdict (a lost worker's rid is
# re-opened and decoded again elsewhere, which takes seconds at most)
VERDICT_WAIT_S = 10.0
_FINISH_REASONS = {FINISH_STOP: FinishReason.STOP, FINISH_LENGTH: FinishReason.LENGTH, FINISH_ERROR: FinishReason.ERROR}


class StepHistogram(Histogram):
    """A Prometheus histogram whose observations wait in plain numbers until `flush_all()` (once per engine step)."""

    dirty: ClassVar[list[StepHistogram]] = []  # the histograms observed since the last flush

    def _metric_init(self) -> None:
        super()._metric_init()
        self._pending = [0] * len(self._upper_bounds)
        self._pending_sum = 0.0
        self._observed = False

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        self._raise_if_not_observable()
        self._pending[bisect_left(self._upper_bounds, amount)] += 1  # the first bucket whose bound is >= amount
        self._pending_sum += amount
        if not self._observed:
            self._observed = True
            StepHistogram.dirty.append(self)

    @classmethod
    def flush_all(cls) -> None:
        for histogram in cls.dirty:
            histogram._sum.inc(histogram._pending_sum)
            for bucket, count in zip(histogram._buckets, histogram._pending, strict=True):
                if count:
                    bucket.inc(count)
            histogram._pending = [0] * len(histogram._pending)
            histogram._pending_sum = 0.0
            histogram._observed = False
        cls.dirty.clear()


class StepPrometheusStatLogger(PrometheusStatLogger):
    """vLLM's Prometheus logger, its histograms written once per step (StepHistogram)."""

    _histogram_cls = StepHistogram


class _Request:
    __slots__ = ("stats", "prompt_len", "max_tokens", "lora", "prefilling", "cached_tokens", "deferred", "engine")

    def __init__(self, request: EngineCoreRequest, arrival_time: float, deferred: bool) -> None:
        self.stats = RequestStateStats(arrival_time=arrival_time)
        self.prompt_len = len(request.prompt_token_ids or ())
        params = request.sampling_params
        self.max_tokens = params.max_tokens if params is not None else None
        self.lora = request.lora_request.lora_name if request.lora_request is not None else None
        self.prefilling = True
        self.cached_tokens = 0
        self.deferred = deferred  # a worker may end it: its ids are counted when it ends
        self.engine = 0  # the engine core (data parallel rank) whose outputs it had


class VllmStats:
    """The stats of one vLLM source: its requests' running stats, each step recorded by vLLM's loggers."""

    def __init__(self, vllm_config: VllmConfig, engine_indexes: list[int]) -> None:
        """`engine_indexes`: the engine cores (data parallel ranks) the client runs, as vLLM's AsyncLLM passes them."""
        self.loggers = StatLoggerManager(
            vllm_config, engine_idxs=engine_indexes, custom_stat_loggers=[StepPrometheusStatLogger]
        )
        self.loggers.log_engine_initialized()
        self.lora_states = LoRARequestStates(log_stats=True)
        self.requests: dict[str, _Request] = {}
        # requests with stop strings the engine ended, until their worker's verdict: (entry, the engine's finish,
        # when it came: time.monotonic())
        self.awaiting_verdict: dict[str, tuple[_Request, FinishReason, float]] = {}

    def added(self, request: EngineCoreRequest, arrival_time: float, *, deferred: bool) -> None:
        """A request added to the engine core; `deferred`: it has stop strings, which a worker may find first."""
        self.requests[request.request_id] = entry = _Request(request, arrival_time, deferred)
        self.lora_states.request_waiting(request.request_id, entry.lora)

    def step(self, outputs: EngineCoreOutputs) -> None:
        """One engine step: the outputs of the requests still running in detok (one ended in detok, by a worker's stop
        or its client, was taken out by `ended` before: vLLM ignores a request's outputs after it ends), then the
        step's scheduler stats."""
        stats = IterationStats() if outputs.outputs else None
        if stats is not None:
            timestamp = outputs.timestamp
            engine = outputs.engine_index
            requests = self.requests
            for output in outputs.outputs:
                entry = requests.get(output.request_id)
                if entry is not None:
                    entry.engine = engine
                    self._output(stats, entry, output, timestamp)
        self.lora_states.update_scheduler_stats(outputs.scheduler_stats)
        self.loggers.record(
            scheduler_stats=outputs.scheduler_stats, iteration_stats=stats, engine_idx=outputs.engine_index
        )
        if self.awaiting_verdict:
            per_engine: dict[int, IterationStats] = {}
            self._verdicts({}, per_engine)
            self._record(per_engine)
        StepHistogram.flush_all()

    def ended(self, rids: list[str], finishes: dict[str, Finish], delivered: Sequence[str] = ()) -> None:
        """Requests detok ended: a worker's Finish in `finishes` (a stop string, or an id it could not decode), else
        its client left or detok failed it (see the module doc); `delivered`: ended for their client before their
        worker's Finish came (it is on its way: they wait for it as for a verdict). Recorded at once: the engine may
        have no further step to record them with."""
        for rid in delivered:
            if rid not in finishes and (entry := self.requests.pop(rid, None)) is not None:
                self.awaiting_verdict[rid] = (entry, FinishReason.STOP, time.monotonic())
        per_engine: dict[int, IterationStats] = {}
        for rid in rids:
            entry = self.requests.pop(rid, None)
            if entry is not None:
                finish = finishes.get(rid)
                self._end(per_engine, rid, entry, finish, None if finish is None else FinishReason.STOP)
        if self.awaiting_verdict:
            self._verdicts(finishes, per_engine)
        self._record(per_engine)
        StepHistogram.flush_all()

    def _verdicts(self, finishes: dict[str, Finish], per_engine: dict[int, IterationStats]) -> None:
        """Requests with stop strings that the engine ended, and requests whose client had their end before their
        worker's Finish came: each ends as its worker's Finish says (a stop string in its last ids: "stop", with the
        ids kept), or as the engine said once VERDICT_WAIT_S passed without one."""
        now = time.monotonic()
        for rid, (entry, engine_reason, since) in list(self.awaiting_verdict.items()):
            finish = finishes.get(rid)
            if finish is None and now - since < VERDICT_WAIT_S:
                continue
            del self.awaiting_verdict[rid]
            if finish is None:  # its worker's Finish was lost (or the worker was): counted late, as the engine said
                log.warning("engine: no worker verdict on %s in %.0f s; it ends as the engine said", rid, now - since)
            self._end(per_engine, rid, entry, finish, engine_reason)

    def _end(
        self,
        per_engine: dict[int, IterationStats],
        rid: str,
        entry: _Request,
        finish: Finish | None,
        reason: FinishReason | None,
    ) -> None:
        """One request's end in its engine's stats: the ids its worker kept (`finish`), its ids counted now when
        they waited for its end, and finished as `finish` says, else with `reason` (None: no finished request, its
        client left or detok failed it)."""
        stats = per_engine.get(entry.engine)
        if stats is None:
            stats = per_engine[entry.engine] = IterationStats()
        if finish is not None:
            if finish.n_tokens >= 0:
                entry.stats.num_generation_tokens = min(entry.stats.num_generation_tokens, finish.n_tokens)
            reason = _FINISH_REASONS.get(finish.reason, reason)
        if entry.deferred:  # its ids wait for its end (the others were counted as they came)
            stats.num_generation_tokens += entry.stats.num_generation_tokens
        if reason is None:
            self.lora_states.request_finished(rid, entry.lora)
        else:
            self._finished(stats, rid, entry, reason)

    def _record(self, per_engine: dict[int, IterationStats]) -> None:
        for engine, stats in per_engine.items():
            self.loggers.record(scheduler_stats=None, iteration_stats=stats, engine_idx=engine)

    async def log_periodically(self) -> None:
        """vLLM's stats line (throughput, running and waiting requests, KV cache use) every VLLM_LOG_STATS_INTERVAL
        seconds, as vLLM's server logs it (at debug level while the engine is idle, as vLLM does)."""
        while True:
            await asyncio.sleep(envs.VLLM_LOG_STATS_INTERVAL)
            self.loggers.log()

    def _output(self, stats: IterationStats, entry: _Request, output: EngineCoreOutput, timestamp: float) -> None:
        stats.update_from_output(output, timestamp, entry.prefilling, entry.stats, self.lora_states, entry.lora)
        if entry.prefilling:
            if output.prefill_stats is not None:
                entry.cached_tokens = output.prefill_stats.num_cached_tokens
            entry.prefilling = False
        if entry.deferred:
            stats.num_generation_tokens -= len(output.new_token_ids)
        if output.finish_reason is not None:
            del self.requests[output.request_id]
            if entry.deferred and output.finish_reason != FinishReason.ABORT:  # its worker says how it ended
                self.awaiting_verdict[output.request_id] = (entry, output.finish_reason, time.monotonic())
                return
            if entry.deferred:
                stats.num_generation_tokens += entry.stats.num_generation_tokens
            self._finished(stats, output.request_id, entry, output.finish_reason)

    def _finished(self, stats: IterationStats, rid: str, entry: _Request, reason: FinishReason) -> None:
        stats.update_from_finished_request(
            finish_reason=reason,
            request_id=rid,
            num_prompt_tokens=entry.prompt_len,
            max_tokens_param=entry.max_tokens,
            req_stats=entry.stats,
            num_cached_tokens=entry.cached_tokens,
        )
        self.lora_states.request_finished(rid, entry.lora)
        # the front fans n out into one engine request per choice: each is a request without a parent here
        ParentRequest.observe_finished_request(None, stats, entry.stats.num_generation_tokens)
