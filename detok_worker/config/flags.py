"""The command-line side of the config: argparse flags that map to dotted config keys, and the effective
config written back as TOML (what `detok serve` hands to its children and `detok config` prints).

Every process entry point (detok serve/worker/front/engine, engine-stub) builds its parser from the
`add_*_flags` helpers here and calls `config_from_args`, so one flag means the same thing everywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable
from typing import Any

from detok_worker.config import ConfigError, DetokConfig, load_config
from detok_worker.config.schema import ENGINE_SOURCES, LOG_FORMATS, parse_set_value
from detok_worker.errors import OperatorError

# argparse dest prefix marking "this flag is the config key after the colon".
_OVERRIDE = "override:"
# Keys whose value should not be on a command line: any local user can read /proc/PID/cmdline.
SECRET_KEYS = {"front.api_key": "DETOK_API_KEY or a 0600 file named by front.api_key_file"}


def add_override_flag(group: argparse._ActionsContainer, flag: str, key: str, help: str, **kwargs: Any) -> None:
    """Add a flag whose value overrides config key `key` (dotted); collected by overrides_from_args."""
    if "choices" not in kwargs and kwargs.get("action") != "store_true":
        kwargs.setdefault("metavar", flag.lstrip("-").replace("-", "_").upper())
    group.add_argument(flag, dest=_OVERRIDE + key, default=None, help=help, **kwargs)


def add_override_flags(group: argparse._ActionsContainer, *flags: tuple[str, str, str, dict[str, Any]]) -> None:
    """add_override_flag for each (flag, key, help, keyword arguments)."""
    for flag, key, help, kwargs in flags:
        add_override_flag(group, flag, key, help, **kwargs)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every process has: config file, tokenizer, runtime dir, logging, and generic --set KEY=VALUE."""
    group = parser.add_argument_group("configuration")
    group.add_argument("--config", metavar="FILE", help="TOML config file (default: configs/default.toml)")
    group.add_argument(
        "--set",
        dest="set_overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override any config key, e.g. --set engine.tokens_per_step=4 (VALUE is a TOML literal or a string)",
    )
    add_override_flags(
        group,
        ("--tokenizer", "tokenizer.path", "tokenizer file or directory (default: the embedded Qwen3)", {}),
        ("--runtime-dir", "bus.runtime_dir", "directory of the ipc sockets (must be private, mode 0700)", {}),
        ("--log-format", "logging.format", "log line format", {"choices": LOG_FORMATS}),
        ("--log-level", "logging.level", "log level (DEBUG, INFO, WARNING, ERROR)", {"type": str.upper}),
    )


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of the engine stub (also accepted by `detok serve`, which passes them to its engine)."""
    add_override_flags(
        parser.add_argument_group("engine"),
        ("--source", "engine.source", "token source", {"choices": ENGINE_SOURCES}),
        (
            "--engine-url",
            "engine.engine_url",
            "grpc://host:port of the gRPC engine (--source grpc)",
            {"metavar": "URL"},
        ),
        ("--trace", "engine.trace", "trace file for --source trace", {"metavar": "FILE"}),
        ("--model", "engine.model", "GGUF file (--source llama-cpp) or vLLM's model (--source vllm)", {}),
        ("--step-interval-ms", "engine.step_interval_ms", "decode step interval (0 = flat out)", {"type": float}),
        ("--max-batch", "engine.max_batch", "max rids generating at once", {"type": int}),
        ("--tokens-per-step", "engine.tokens_per_step", "ids per rid per step (k > 1: speculative)", {"type": int}),
        ("--replay-speed", "engine.replay_speed", "trace replay speed (1 = recorded, 0 = flat out)", {"type": float}),
        ("--seed", "engine.seed", "seed of the corpus source", {"type": int}),
        ("--record", "engine.record", "record requests and emitted tokens to this trace file", {"metavar": "FILE"}),
    )


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


ENGINE_ARGS_DEST = _OVERRIDE + "engine.vllm_args"


def split_engine_args(argv: list[str] | tuple[str, ...]) -> tuple[list[str], list[str] | None]:
    """`detok serve ... -- FLAGS`: detok's own arguments, and the engine's flags after the first `--` (None when
    there is no `--`); they go to engine.vllm_args (args.ENGINE_ARGS_DEST)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


# set by `detok serve` for its children: the digest of the engine.vllm_args whose front-end flags it applied to
# the config file it hands them (a front started on its own applies them itself)
VLLM_FLAGS_APPLIED_ENV = "DETOK_VLLM_FLAGS_APPLIED"


def vllm_flags_digest(config: DetokConfig) -> str:
    return hashlib.sha256("\0".join([config.engine.model, *config.engine.vllm_args]).encode("utf-8")).hexdigest()


def add_front_flags(parser: argparse.ArgumentParser) -> None:
    """Flags of the HTTP front (also accepted by `detok serve`)."""
    add_override_flags(
        parser.add_argument_group("front"),
        ("--host", "front.host", "HTTP listen address", {}),
        ("--port", "front.port", "HTTP port (0 = pick a free one)", {"type": int}),
        ("--fronts", "front.processes", "front processes sharing the port (detok serve)", {"type": int}),
        (
            "--reasoning-parser",
            "front.reasoning_parser",
            "qwen3, deepseek_r1, deepseek_v3, gpt_oss, glm45, kimi_k2, minimax_m2, minimax_m2_append_think, olmo3, "
            "granite, auto, none",
            {},
        ),
        (
            "--tool-call-parser",
            "front.tool_call_parser",
            "hermes, qwen, llama3_json, mistral, deepseek_v31, qwen3_coder, glm45, glm47, minimax_m2, kimi_k2, gpt_oss,"
            " deepseek_v32, auto, none",
            {},
        ),
    )
    add_override_flags(
        parser.add_argument_group("encode cache"),
        (
            "--tokenizer-cache-enable-l0",
            "tokenizer.cache.enable_l0",
            "exact-match prompt cache",
            {"action": "store_true"},
        ),
        ("--tokenizer-cache-l0-max-entries", "tokenizer.cache.l0_max_entries", "L0 size (prompts)", {"type": int}),
        ("--tokenizer-cache-enable-l1", "tokenizer.cache.enable_l1", "prefix cache", {"action": "store_true"}),
        ("--tokenizer-cache-l1-max-memory", "tokenizer.cache.l1_max_memory", "L1 size (bytes)", {"type": int}),
    )


def add_worker_count_flag(parser: argparse.ArgumentParser) -> None:
    add_override_flag(parser, "--workers", "worker.count", "number of detok worker processes", type=int)


AddFlags = Callable[[argparse.ArgumentParser], None]
# what `detok serve` takes, and the commands that run or show the same service
SERVICE_FLAGS: tuple[AddFlags, ...] = (add_config_flags, add_worker_count_flag, add_front_flags, add_engine_flags)


def add_command(
    commands: argparse._SubParsersAction,
    name: str,
    handler: Callable[..., int],
    help: str,
    *flags: AddFlags,
    **kwargs: Any,
) -> argparse.ArgumentParser:
    """Register a sub-command that runs `handler(args, config)` and takes the flag groups `flags` (each
    add_config_flags or one that adds it, then a role's); `kwargs` go to add_parser (the description: `help`)."""
    parser = commands.add_parser(name, help=help, **{"description": help, **kwargs})
    parser.set_defaults(handler=handler)
    for add in flags:
        add(parser)
    return parser


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Dotted-key overrides from parsed flags: --set entries first, then the named flags (which win)."""
    overrides: dict[str, Any] = {}
    for entry in getattr(args, "set_overrides", None) or []:
        key, sep, value = entry.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {entry!r}")
        overrides[key] = parse_set_value(value.strip())
        if key in SECRET_KEYS:
            print(
                f"detok: warning: --set {key}=... is readable by every local user in /proc/PID/cmdline; "
                f"use {SECRET_KEYS[key]} instead",
                file=sys.stderr,
            )
    for dest, value in vars(args).items():
        if dest.startswith(_OVERRIDE) and value is not None:
            overrides[dest[len(_OVERRIDE) :]] = value
    return overrides


def config_from_args(args: argparse.Namespace) -> DetokConfig:
    """Load --config (or the default file) and apply every flag; raises ConfigError with the offending key."""
    return load_config(getattr(args, "config", None), overrides_from_args(args))


EXIT_USAGE = 2


def run_with_config(prog: str, args: argparse.Namespace, run: Callable[[argparse.Namespace, DetokConfig], int]) -> int:
    """A command's exit code: `run`'s with the configuration its flags name; 2 when the configuration is wrong
    and 1 on an OperatorError (the message on one line, no traceback), 130 on Ctrl-C."""
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(args, config)
    except KeyboardInterrupt:
        return 130
    except OperatorError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
