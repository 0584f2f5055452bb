"""The one place that picks an engine source by engine.source: `engine_run` gives the source's loop, its module
imported only when chosen: `grpc` needs grpc, `vllm` needs vLLM, and the local sources (corpus, echo, trace,
llama-cpp) are engine_stub's, which no relay needs."""

from __future__ import annotations

from detok_worker.config import DetokConfig
from detok_worker.config.schema import ENGINE_SOURCES
from detok_worker.engine.sources.base import EngineRun, RunOptions
from detok_worker.errors import OperatorError

RELAY_SOURCES = ("grpc", "vllm")  # a real engine behind: it schedules, detok relays its ids
# every other name is engine_stub's (engine_stub/local.py: create_local_source), run by its loop in this process
LOCAL_SOURCES = tuple(source for source in ENGINE_SOURCES if source not in RELAY_SOURCES)


def engine_run(source: str) -> EngineRun:
    """The loop of engine source `source` (one of config.schema.ENGINE_SOURCES)."""
    if source == "grpc":
        from detok_worker.engine.sources.grpc_gateway import run_gateway

        return run_gateway
    if source == "vllm":
        try:
            from detok_worker.engine.sources.vllm_source import run_vllm_source
        except ImportError as exc:
            raise OperatorError(
                f"engine.source = vllm needs vLLM in this Python environment (README, 'With a real engine'): {exc}"
            ) from exc
        return run_vllm_source
    if source in LOCAL_SOURCES:
        from engine_stub.local import run_local

        return run_local
    raise OperatorError(f"unknown engine.source {source!r}: one of {', '.join(LOCAL_SOURCES + RELAY_SOURCES)}")


def run_source(config: DetokConfig, options: RunOptions) -> int:
    """Run the configured engine source until it ends; its exit code."""
    source = config.engine.source
    if options.replay is not None and source not in LOCAL_SOURCES:
        raise OperatorError(f"--replay needs a local engine source ({', '.join(LOCAL_SOURCES)}), not {source}")
    return engine_run(source)(config, options)
