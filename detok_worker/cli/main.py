"""The `detok` command.

  detok serve     front + engine + N workers, supervised (the one command most users need)
  detok worker    one detok worker process        detok front    the HTTP front
  detok engine    the engine: a local source (corpus, echo, trace, llama-cpp), --source grpc the gateway to
                  a gRPC engine, --source vllm vLLM's engine core (`vllm serve` engine flags after --)
  detok engine-server    the local sources served as a gRPC VllmEngine (engine_stub: for tests and benches)
  detok config    print the effective config (files + flags) as TOML
  detok trace     record | synth | replay | inspect token traces
  detok tokenize | detokenize | template    look inside a tokenizer (ids, tokens, offsets, chat prompts)

Every subcommand takes --config FILE, --set KEY=VALUE and the flags of its role (see detok_worker.config.flags).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from detok_worker.cli.bench import add_bench_command
from detok_worker.cli.service import run_service, with_vllm_flags
from detok_worker.cli.tokenizer import add_tokenizer_commands
from detok_worker.cli.trace import add_trace_commands
from detok_worker.config import DetokConfig, config_to_toml
from detok_worker.config.flags import (
    ENGINE_ARGS_DEST,
    SERVICE_FLAGS,
    add_command,
    add_config_flags,
    add_engine_flags,
    add_engine_server_flags,
    add_front_flags,
    run_with_config,
    split_engine_args,
)
from detok_worker.engine.command import add_engine_command_flags, run_engine_command
from detok_worker.errors import OperatorError
from detok_worker.process.logs import setup_logging
from detok_worker.process.runtime import watch_parent

log = logging.getLogger("detok")


def _start_role(role: str, config: DetokConfig) -> None:
    setup_logging(role, config.logging.level, config.logging.format)
    watch_parent()


def cmd_serve(args: argparse.Namespace, config: DetokConfig) -> int:
    return run_service(config, args.startup_timeout)


def cmd_worker(args: argparse.Namespace, config: DetokConfig) -> int:
    from detok_worker.worker.process import run_worker

    _start_role(f"worker:{args.id}" if args.id else "worker", config)
    run_worker(config, args.id)
    return 0


def cmd_front(args: argparse.Namespace, config: DetokConfig) -> int:
    from detok_worker.front.server import run_front

    if not 0 <= args.index < config.front.processes:
        raise OperatorError(f"--index {args.index} is not one of the {config.front.processes} front.processes")
    config = with_vllm_flags(config)
    _start_role(f"front:{args.index}" if args.index else "front", config)
    run_front(config, index=args.index)
    return 0


def cmd_engine_server(args: argparse.Namespace, config: DetokConfig) -> int:
    from engine_stub.grpc_server import run_engine_server

    setup_logging("engine-server", config.logging.level, config.logging.format)
    return run_engine_server(args, config)


def cmd_config(args: argparse.Namespace, config: DetokConfig) -> int:
    sys.stdout.write(config_to_toml(with_vllm_flags(config, needs_vllm=False)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="detok", description="Exact streaming detokenizer service for LLM serving.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve = add_command(
        commands, "serve", cmd_serve, "run front + engine + N detok workers, supervised", *SERVICE_FLAGS
    )
    serve.add_argument("--startup-timeout", type=float, default=60.0, metavar="S", help="seconds to wait for /health")
    worker = add_command(
        commands, "worker", cmd_worker, "run one detok worker (connects to the engine and the front)", add_config_flags
    )
    worker.add_argument("--id", default=None, help="worker id (default: HOSTNAME-PID); unique per live worker")
    front = add_command(
        commands, "front", cmd_front, "run the OpenAI-compatible HTTP front", add_config_flags, add_front_flags
    )
    front.add_argument(
        "--index", type=int, default=0, help="which of the front.processes front processes this is (0 .. N-1)"
    )
    add_command(
        commands,
        "engine",
        run_engine_command,
        "run the engine (a local source, the gRPC gateway or vLLM's engine)",
        add_engine_command_flags,
    )
    add_command(
        commands,
        "engine-server",
        cmd_engine_server,
        "serve the local token sources as a gRPC VllmEngine (tests, benches)",
        add_config_flags,
        add_engine_flags,
        add_engine_server_flags,
    )
    add_command(commands, "config", cmd_config, "print the effective configuration as TOML", *SERVICE_FLAGS)
    add_trace_commands(commands)
    add_tokenizer_commands(commands)
    add_bench_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv, engine_args = split_engine_args(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if engine_args is not None:
        if args.command not in ("serve", "engine", "config") and getattr(args, "trace_command", None) != "record":
            parser.error(f"detok {args.command} takes no engine flags after --")
        setattr(args, ENGINE_ARGS_DEST, engine_args)
    return run_with_config(f"detok {args.command}", args, args.handler)


if __name__ == "__main__":
    sys.exit(main())
