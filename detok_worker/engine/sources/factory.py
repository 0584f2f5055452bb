"""The one place that picks an engine source by engine.source: `engine_run` gives the source's loop (a relay's
module is imported only when chosen: `grpc` needs grpc, `vllm` needs vLLM), and `create_local_source` the token
source the local loop (local.py) runs: corpus, echo, trace or llama-cpp (cyllama is imported when a model loads)."""

from __future__ import annotations

from detok_worker.config import DetokConfig
from detok_worker.engine.sources import planned
from detok_worker.engine.sources.base import EngineRun, GeneratingSource, RunOptions, SourceError, TokenSource
from detok_worker.engine.sources.corpus_ids import passage_ids
from detok_worker.engine.sources.llama import LlamaGenerator, LlamaSource, default_model_path
from detok_worker.errors import OperatorError
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import read_trace

LOCAL_SOURCES = ("corpus", "echo", "trace", "llama-cpp")
RELAY_SOURCES = ("grpc", "vllm")  # a real engine behind: it schedules, detok relays its ids


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
        return _run_local
    raise OperatorError(f"unknown engine.source {source!r}: one of {', '.join(LOCAL_SOURCES + RELAY_SOURCES)}")


def run_source(config: DetokConfig, options: RunOptions) -> int:
    """Run the configured engine source until it ends; its exit code."""
    source = config.engine.source
    if options.replay is not None and source not in LOCAL_SOURCES:
        raise OperatorError(f"--replay needs a local engine source ({', '.join(LOCAL_SOURCES)}), not {source}")
    return engine_run(source)(config, options)


def _run_local(config: DetokConfig, options: RunOptions) -> int:
    from detok_worker.engine.sources.local import run_local

    tokenizer = load_configured_tokenizer(config)
    return run_local(config, tokenizer, create_local_source(config, tokenizer), options)


def create_local_source(config: DetokConfig, tokenizer: Tokenizer) -> TokenSource | GeneratingSource:
    """The token source of a local engine.source (the local loop's, and the gRPC test engine server's)."""
    engine = config.engine
    eos_id = planned.primary_eos_id(tokenizer)
    if engine.source == "echo":
        return planned.EchoSource(eos_id)
    if engine.source == "trace":
        return planned.TraceSource(read_trace(engine.trace), engine.replay_speed)
    if engine.source == "llama-cpp":
        generator = LlamaGenerator(engine.model or default_model_path(), engine.model_threads)
        return LlamaSource(generator, tokenizer)
    if engine.source != "corpus":
        raise SourceError(f"engine.source {engine.source!r} is not a local token source")
    passages = planned.load_corpus(engine.corpus or None)
    return planned.CorpusSource(tokenizer, passages, eos_id, engine.seed, passage_ids(tokenizer, passages))
