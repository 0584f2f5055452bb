"""The engine role's command line, shared by `detok engine` and `engine-stub` / `python -m engine_stub`: one
entry that runs the engine source engine.source names (sources/factory.py picks it)."""

from __future__ import annotations

import argparse

from detok_worker.config import DetokConfig
from detok_worker.config.flags import add_config_flags, add_engine_flags
from detok_worker.process.logs import setup_logging
from detok_worker.process.runtime import watch_parent


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
    # here, not at the top: every detok process builds this parser, only the engine runs a source
    from detok_worker.engine.sources.base import RunOptions
    from detok_worker.engine.sources.factory import run_source

    return run_source(config, RunOptions(args.replay, exit_after_replay=args.exit_after_replay))
