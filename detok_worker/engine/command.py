"""The engine role's command line, shared by `detok engine` and `engine-stub` / `python -m engine_stub`: one
entry that runs the configured engine source. The stub's own sources (corpus, echo, trace, llama-cpp) are imported
only when chosen, so `--source grpc` and `--source vllm` never load engine_stub."""

from __future__ import annotations

import argparse

from detok_worker.config import DetokConfig
from detok_worker.config.flags import add_config_flags, add_engine_flags
from detok_worker.errors import OperatorError
from detok_worker.process.logs import setup_logging
from detok_worker.process.parent_watch import watch_parent


def add_engine_command_flags(parser: argparse.ArgumentParser) -> None:
    """Everything `detok engine` / `engine-stub` accept."""
    add_config_flags(parser)
    add_engine_flags(parser)
    parser.add_argument("--replay", metavar="FILE", help="generate the requests of this trace (no front needed)")
    parser.add_argument("--exit-after-replay", action="store_true", help="exit once the replayed requests ended")


def run_engine_command(args: argparse.Namespace, config: DetokConfig) -> int:
    """Run the engine role with engine.source until it ends."""
    setup_logging("engine", config.logging.level, config.logging.format)
    watch_parent()
    source = config.engine.source
    if source == "grpc":
        from detok_worker.engine.grpc_gateway import run_gateway

        run_gateway(config)
        return 0
    if source == "vllm":
        try:
            from detok_worker.engine.vllm_source import run_vllm_source
        except ImportError as exc:
            raise OperatorError(
                f"engine.source = vllm needs vLLM in this Python environment (README, 'With a real engine'): {exc}"
            ) from exc
        return run_vllm_source(config)
    from engine_stub.engine import run_engine

    run_engine(config, args.replay, exit_after_replay=args.exit_after_replay)
    return 0
