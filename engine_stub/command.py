"""The engine stub's command line, shared by `detok engine` and `engine-stub` / `python -m engine_stub`."""

from __future__ import annotations

import argparse

from detok_worker.config import DetokConfig
from detok_worker.config.flags import add_config_flags, add_engine_flags
from detok_worker.process.logs import setup_logging
from detok_worker.process.parent_watch import watch_parent


def add_engine_command_flags(parser: argparse.ArgumentParser) -> None:
    """Everything `detok engine` / `engine-stub` accept."""
    add_config_flags(parser)
    add_engine_flags(parser)
    parser.add_argument("--replay", metavar="FILE", help="generate the requests of this trace (no front needed)")
    parser.add_argument("--exit-after-replay", action="store_true", help="exit once the replayed requests ended")


def add_engine_server_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `detok engine-server` / engine_stub.grpc_server (here: parsing them must not import grpc)."""
    parser.add_argument("--listen", default="127.0.0.1:50051", metavar="HOST:PORT", help="gRPC address (port 0: any)")
    parser.add_argument("--stats-file", metavar="FILE", help="write request/abort counts here as JSON")
    parser.add_argument("--requests-log", metavar="FILE", help="append one JSON line per ended request (its ids)")
    parser.add_argument(
        "--cancel-starts",
        type=int,
        default=0,
        metavar="N",
        help="fault injection for tests: end the first N Generate calls with CANCELLED before any response",
    )


def run_engine_command(args: argparse.Namespace, config: DetokConfig) -> int:
    """Run the engine role (the stub, or the gateway for `engine.source = "grpc"`) until it ends."""
    setup_logging("engine", config.logging.level, config.logging.format)
    watch_parent()
    if config.engine.source == "grpc":
        from detok_worker.engine.grpc_gateway import run_gateway

        run_gateway(config)
        return 0
    from engine_stub.engine import run_engine

    run_engine(config, args.replay, exit_after_replay=args.exit_after_replay)
    return 0
