"""Configuration: TOML files in configs/ parsed into msgspec structs, then CLI overrides on top.

Every option is documented in configs/default.toml; `load_config(path, overrides)` is the only entry point.
Overrides are dotted keys ("front.port") mapped to values, applied before validation, so a CLI flag and a TOML
key go through the same checks.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import tomli_w

from detok_worker.errors import OperatorError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PROMPT_TOKENS_CAP = 1_048_576  # front.max_prompt_tokens = 0: the tokenizer's model_max_length, at most this
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # configs/, shipped as package data


class ConfigError(OperatorError, ValueError):
    """A config file or override is invalid; the message names the key."""


class TokenizerCacheConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    enable_l0: bool = False
    l0_max_entries: int = 10_000
    enable_l1: bool = False
    l1_max_memory: int = 50 * 1024 * 1024


class TokenizerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    path: str = ""  # "" = the embedded default (Qwen3); also a Hub id, an OpenAI model name, module:Class
    chat_template: str = ""  # "" = the tokenizer's own
    backend: str = ""  # "" = detect from the content; else one of detok_worker.tokenizer.loading.routing.BACKENDS
    revision: str = ""  # Hub revision (branch, tag or commit) for a Hub model id; "" = the default branch
    model_encodings: dict[str, str] = {}  # extra OpenAI model name -> tiktoken encoding routes
    cache: TokenizerCacheConfig = TokenizerCacheConfig()


class BusConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    runtime_dir: str = ""  # "" = a fresh private (0700) temp directory per `detok serve`
    engine_endpoint: str = ""  # front -> engine (Submit/Abort); "" = ipc in runtime_dir
    worker_endpoint: str = ""  # engine <-> workers (ROUTER/DEALER); "" = ipc in runtime_dir
    front_endpoint: str = ""  # workers/engine -> front (TextBatch, stats); "" = ipc in runtime_dir
    high_water_mark: int = 10_000
    max_message_bytes: int = 64 * 1024 * 1024  # ZMQ_MAXMSGSIZE of every receiving socket; a bigger frame drops
    curve_server_public_key: str = ""
    curve_server_secret_key: str = ""
    allow_insecure_tcp: bool = False


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
ENGINE_SOURCES = ("corpus", "echo", "trace", "llama-cpp", "grpc", "vllm")


class EngineConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    source: str = "corpus"  # one of ENGINE_SOURCES
    engine_url: str = ""  # source = grpc: grpc://host:port of an engine serving the token-only gRPC API
    engine_service: str = "auto"  # auto | vllm (VllmEngine) | sglang (SglangScheduler)
    connect_timeout_s: float = 10.0  # source = grpc: how long to wait for the engine at start-up
    start_retries: int = 3  # source = grpc: a Generate that fails before its first chunk is sent again this often
    trace: str = ""
    corpus: str = ""  # "" = the shipped corpus (engine/sources/corpus/)
    step_interval_ms: float = 20.0
    max_batch: int = 256
    tokens_per_step: int = 1
    replay_speed: float = 1.0  # trace replay: 1.0 = recorded speed, 0 = as fast as possible
    heartbeat_timeout_s: float = 1.0
    batch_answer_timeout_s: float = 10.0  # a worker that handles none of its TokenBatches this long is lost
    stats_interval_s: float = 0.5  # EngineStats to the front (GET /stats)
    seed: int = 0
    record: str = ""  # "" = off; a path = record every Submit and emitted Tokens item as a trace
    model: str = ""  # source = llama-cpp: a GGUF file ("" = SmolLM2-135M); source = vllm: vLLM's model (dir or id)
    vllm_args: list[str] = []  # source = vllm: `vllm serve` engine flags (what follows `--` on the command line)
    model_threads: int = 1


class WorkerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    count: int = 2
    heartbeat_interval_s: float = 0.2
    stats_interval_s: float = 0.5
    max_stop_strings: int = 64
    max_stop_string_chars: int = 1024
    max_live_stop_chars: int = 4_194_304  # stop-string characters over all live rids of one worker


class FrontConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = ""  # "" = derived from the tokenizer name
    api_key: str = ""  # "" = no auth
    max_request_bytes: int = 4 * 1024 * 1024
    max_tokens_default: int = 256
    max_tokens_limit: int = 32_768
    max_n: int = 16  # choices per request (n); each is one engine request
    max_pending_chars: int = 1_000_000  # per-request buffer for a slow client; past it the request is aborted
    max_total_pending_chars: int = 64_000_000  # over all streams; past it new requests get 503
    max_prompt_chars: int = 1_000_000  # characters of a prompt (all messages), checked before encoding
    max_prompt_tokens: int = 0  # 0 = the tokenizer's model_max_length where known, else PROMPT_TOKENS_CAP
    request_timeout_s: float = 600.0
    # chat output parsers (detok_worker/parse/registry.py): "auto" = by the tokenizer's family, "none" = off
    reasoning_parser: str = "auto"
    tool_call_parser: str = "auto"
    max_model_len: int = 0  # 0 = tokenizer_config.json's model_max_length, when it gives one
    cors_allowed_origins: list[str] = []  # [] = no CORS headers; ["*"] = any origin
    cors_allowed_methods: list[str] = msgspec.field(default_factory=lambda: ["GET", "POST", "OPTIONS"])
    cors_allowed_headers: list[str] = msgspec.field(
        default_factory=lambda: ["Authorization", "Content-Type", "X-Request-Id"]
    )
    cors_allow_credentials: bool = False
    api_key_file: str = ""  # a file (mode 0600) holding the API key; or DETOK_API_KEY in the environment
    drain_timeout_s: float = 20.0  # SIGTERM: in-flight requests get this long to finish
    header_timeout_s: float = 10.0  # a request head not complete after this long: connection closed
    body_timeout_s: float = 60.0  # a request body not complete this long after its head: connection closed
    keep_alive_timeout_s: float = 5.0  # an idle keep-alive connection is closed after this long
    max_connections: int = 10_000  # open HTTP connections; beyond it 503 (also kept below the fd limit)
    access_log: bool = True  # one INFO line per HTTP request on the detok.access logger (front/request_log.py)
    processes: int = 1  # front processes of `detok serve`, all on host:port (SO_REUSEPORT), each with its own bus PULL


class LoggingConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    level: str = "INFO"
    format: str = "human"  # human | json


class DetokConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    tokenizer: TokenizerConfig = TokenizerConfig()
    bus: BusConfig = BusConfig()
    engine: EngineConfig = EngineConfig()
    worker: WorkerConfig = WorkerConfig()
    front: FrontConfig = FrontConfig()
    logging: LoggingConfig = LoggingConfig()


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config key {dotted!r}: {part!r} is not a section")
    node[leaf] = value


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> DetokConfig:
    """Read a TOML file (default: configs/default.toml if present), apply dotted-key overrides, validate."""
    tree: dict[str, Any] = {}
    file = Path(path) if path else CONFIG_DIR / "default.toml"
    if path or file.exists():
        try:
            tree = tomllib.loads(file.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {file}: {exc}") from exc
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(tree, key, value)
    try:
        config = msgspec.convert(tree, DetokConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid config: {exc}") from exc
    validate(config)
    if config.engine.source == "vllm" and not config.tokenizer.path:  # the model's own tokenizer
        config = msgspec.structs.replace(
            config, tokenizer=msgspec.structs.replace(config.tokenizer, path=config.engine.model)
        )
    return config


def validate(config: DetokConfig) -> None:
    """Checks msgspec's types cannot express."""
    checks = [
        (config.worker.count >= 1, "worker.count must be >= 1"),
        (config.front.processes >= 1, "front.processes must be >= 1"),
        (
            config.logging.level.upper() in LOG_LEVELS,
            f"logging.level must be one of {', '.join(LOG_LEVELS)} (got {config.logging.level!r})",
        ),
        (config.engine.source in ENGINE_SOURCES, f"engine.source must be one of {', '.join(ENGINE_SOURCES)}"),
        (config.engine.source != "trace" or bool(config.engine.trace), "engine.source = trace needs engine.trace"),
        (
            config.engine.source != "grpc" or config.engine.engine_url.startswith("grpc://"),
            "engine.source = grpc needs engine.engine_url = grpc://host:port",
        ),
        (config.engine.source != "vllm" or bool(config.engine.model), "engine.source = vllm needs engine.model"),
        (
            config.engine.engine_service in ("auto", "vllm", "sglang"),
            "engine.engine_service must be auto, vllm or sglang",
        ),
        (config.engine.connect_timeout_s > 0, "engine.connect_timeout_s must be > 0"),
        (config.engine.start_retries >= 0, "engine.start_retries must be >= 0"),
        (config.engine.step_interval_ms >= 0, "engine.step_interval_ms must be >= 0"),
        (config.engine.max_batch >= 1, "engine.max_batch must be >= 1"),
        (config.engine.model_threads >= 1, "engine.model_threads must be >= 1"),
        (config.engine.tokens_per_step >= 1, "engine.tokens_per_step must be >= 1"),
        (config.engine.replay_speed >= 0, "engine.replay_speed must be >= 0"),
        (config.engine.stats_interval_s > 0, "engine.stats_interval_s must be > 0"),
        (config.worker.stats_interval_s > 0, "worker.stats_interval_s must be > 0"),
        (0 < config.front.port < 65536 or config.front.port == 0, "front.port must be 0..65535"),
        (config.front.max_tokens_default >= 1, "front.max_tokens_default must be >= 1"),
        (config.front.max_tokens_limit >= config.front.max_tokens_default, "front.max_tokens_limit too small"),
        (config.front.max_n >= 1, "front.max_n must be >= 1"),
        (config.front.max_request_bytes > 0, "front.max_request_bytes must be > 0"),
        (config.front.max_pending_chars > 0, "front.max_pending_chars must be > 0"),
        (config.front.max_total_pending_chars > 0, "front.max_total_pending_chars must be > 0"),
        (config.front.max_prompt_chars > 0, "front.max_prompt_chars must be > 0"),
        (config.front.max_prompt_tokens >= 0, "front.max_prompt_tokens must be >= 0"),
        (config.bus.max_message_bytes >= 65536, "bus.max_message_bytes must be >= 65536"),
        (config.engine.batch_answer_timeout_s >= 0, "engine.batch_answer_timeout_s must be >= 0 (0 = off)"),
        (config.worker.max_live_stop_chars > 0, "worker.max_live_stop_chars must be > 0"),
        (config.front.max_model_len >= 0, "front.max_model_len must be >= 0"),
        (config.front.drain_timeout_s >= 0, "front.drain_timeout_s must be >= 0"),
        (config.front.header_timeout_s > 0, "front.header_timeout_s must be > 0"),
        (config.front.body_timeout_s > 0, "front.body_timeout_s must be > 0"),
        (config.front.keep_alive_timeout_s > 0, "front.keep_alive_timeout_s must be > 0"),
        (config.front.max_connections >= 1, "front.max_connections must be >= 1"),
        (config.logging.format in ("human", "json"), "logging.format must be human or json"),
        (config.tokenizer.cache.l0_max_entries > 0, "tokenizer.cache.l0_max_entries must be > 0"),
        (config.tokenizer.cache.l1_max_memory > 0, "tokenizer.cache.l1_max_memory must be > 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def config_to_toml(config: DetokConfig) -> str:
    """The full effective config as a TOML document that `load_config` reads back to an equal config."""
    header = "# effective detok configuration (every option, after files and flags)\n\n"
    return header + tomli_w.dumps(msgspec.to_builtins(config))
