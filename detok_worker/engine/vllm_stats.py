"""vLLM's metrics and its periodic stats log line from the vLLM source, through vLLM's own classes: the engine core
runs with stats on (unless `--disable-log-stats`), each engine step's scheduler stats and its outputs go into vLLM's
`IterationStats` / `RequestStateStats` as vLLM's output processor puts them there, and vLLM's `StatLoggerManager`
(its `PrometheusStatLogger` and `LoggingStatLogger`) records them. So the `vllm:*` families have vLLM's names,
types, labels and buckets for the installed vLLM. In `detok serve` every process writes its Prometheus values to
the shared multiprocess directory, so the front's /metrics shows these beside detok's own families.

Work is per engine step and per request output, as in vLLM's own front end; nothing per token.
"""

from __future__ import annotations

import asyncio

from vllm.config import VllmConfig
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from vllm.v1.metrics.loggers import StatLoggerManager
from vllm.v1.metrics.stats import IterationStats, LoRARequestStates, RequestStateStats

# vLLM logs its stats line every VLLM_LOG_STATS_INTERVAL seconds (its default)
LOG_INTERVAL_S = 10.0


class _Request:
    __slots__ = ("stats", "prompt_len", "max_tokens", "lora", "prefilling", "cached_tokens")

    def __init__(self, request: EngineCoreRequest, arrival_time: float) -> None:
        self.stats = RequestStateStats(arrival_time=arrival_time)
        self.prompt_len = len(request.prompt_token_ids or ())
        params = request.sampling_params
        self.max_tokens = params.max_tokens if params is not None else None
        self.lora = request.lora_request.lora_name if request.lora_request is not None else None
        self.prefilling = True
        self.cached_tokens = 0


class VllmStats:
    """The stats of one vLLM source: its requests' running stats, each step recorded by vLLM's loggers."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.loggers = StatLoggerManager(vllm_config, engine_idxs=[0])
        self.loggers.log_engine_initialized()
        self.lora_states = LoRARequestStates(log_stats=True)
        self.requests: dict[str, _Request] = {}

    def added(self, request: EngineCoreRequest, arrival_time: float) -> None:
        self.requests[request.request_id] = entry = _Request(request, arrival_time)
        self.lora_states.request_waiting(request.request_id, entry.lora)

    def step(self, outputs: EngineCoreOutputs, ended: dict[str, FinishReason]) -> None:
        """One engine step: its outputs, and the requests that ended in detok since the last step (a stop string
        found by a worker: STOP, as vLLM's own stop-string check ends them; a client gone: ABORT)."""
        stats = IterationStats() if outputs.outputs or ended else None
        if stats is not None:
            for rid, reason in ended.items():  # first: the engine core's ABORT output for them may be in this step
                self._finished(stats, rid, reason)
            timestamp = outputs.timestamp
            for output in outputs.outputs:
                entry = self.requests.get(output.request_id)
                if entry is not None:
                    self._output(stats, entry, output, timestamp)
        self.lora_states.update_scheduler_stats(outputs.scheduler_stats)
        self.loggers.record(
            scheduler_stats=outputs.scheduler_stats, iteration_stats=stats, engine_idx=outputs.engine_index
        )

    async def log_periodically(self) -> None:
        """vLLM's stats line (throughput, running and waiting requests, KV cache use) every LOG_INTERVAL_S, idle or
        not, as vLLM's server logs it."""
        while True:
            await asyncio.sleep(LOG_INTERVAL_S)
            self.loggers.log()

    def _output(self, stats: IterationStats, entry: _Request, output: EngineCoreOutput, timestamp: float) -> None:
        stats.update_from_output(output, timestamp, entry.prefilling, entry.stats, self.lora_states, entry.lora)
        if entry.prefilling:
            if output.prefill_stats is not None:
                entry.cached_tokens = output.prefill_stats.num_cached_tokens
            entry.prefilling = False
        if output.finish_reason is not None:
            self._finished(stats, output.request_id, output.finish_reason)

    def _finished(self, stats: IterationStats, rid: str, reason: FinishReason) -> None:
        entry = self.requests.pop(rid, None)
        if entry is None:
            return
        stats.update_from_finished_request(
            finish_reason=reason,
            request_id=rid,
            num_prompt_tokens=entry.prompt_len,
            max_tokens_param=entry.max_tokens,
            req_stats=entry.stats,
            num_cached_tokens=entry.cached_tokens,
        )
        self.lora_states.request_finished(rid, entry.lora)
