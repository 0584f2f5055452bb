"""Configuration: TOML files in configs/ parsed into msgspec structs, then CLI overrides on top.

Every option is documented in configs/default.toml; `load_config(path, overrides)` is the only entry point.
Overrides are dotted keys ("front.port") mapped to values, applied before validation, so a CLI flag and a TOML
key go through the same checks.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin, get_type_hints

import msgspec
import tomli_w
from msgspec import Meta

from detok_worker.errors import OperatorError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PROMPT_TOKENS_CAP = 1_048_576  # front.max_prompt_tokens = 0: the tokenizer's model_max_length, at most this
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"  # configs/, shipped as package data


class ConfigError(OperatorError, ValueError):
    """A config file or override is invalid; the message names the key."""


# The constraints of the options, declared on their types: msgspec checks them when a config is loaded (validate()
# below reports a violation as "key = value: what it must be"). Closed sets are Literals.
AtLeastOne = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
Port = Annotated[int, Meta(ge=0, le=65535)]  # 0 = any free port
EngineSource = Literal["corpus", "echo", "trace", "llama-cpp", "grpc", "vllm"]
EngineService = Literal["auto", "vllm", "sglang"]  # auto: VllmEngine first, then SglangScheduler
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]  # given in any case
LogFormat = Literal["human", "json"]
UvicornLogLevel = Literal["", "critical", "error", "warning", "info", "debug", "trace"]
ENGINE_SOURCES: tuple[str, ...] = get_args(EngineSource)
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)


class TokenizerCacheConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    enable_l0: bool = False
    l0_max_entries: AtLeastOne = 10_000
    enable_l1: bool = False
    l1_max_memory: AtLeastOne = 50 * 1024 * 1024


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
    # ZMQ_MAXMSGSIZE of every receiving socket; a bigger frame drops
    max_message_bytes: Annotated[int, Meta(ge=65536)] = 64 * 1024 * 1024
    curve_server_public_key: str = ""
    curve_server_secret_key: str = ""
    allow_insecure_tcp: bool = False


class EngineConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    source: EngineSource = "corpus"
    engine_url: str = ""  # source = grpc: grpc://host:port of an engine serving the token-only gRPC API
    engine_service: EngineService = "auto"  # vllm: VllmEngine, sglang: SglangScheduler
    connect_timeout_s: PositiveFloat = 10.0  # source = grpc: how long to wait for the engine at start-up
    # source = grpc: a Generate that fails before its first chunk is sent again this often
    start_retries: NonNegativeInt = 3
    trace: str = ""
    corpus: str = ""  # "" = the shipped corpus (engine_stub/corpus/)
    step_interval_ms: NonNegativeFloat = 20.0
    max_batch: AtLeastOne = 256
    tokens_per_step: AtLeastOne = 1
    replay_speed: NonNegativeFloat = 1.0  # trace replay: 1.0 = recorded speed, 0 = as fast as possible
    heartbeat_timeout_s: float = 1.0
    # a worker that handles none of its TokenBatches this long is lost; 0 = off
    batch_answer_timeout_s: NonNegativeFloat = 10.0
    stats_interval_s: PositiveFloat = 1.0  # EngineStats to the front (GET /stats)
    seed: int = 0
    record: str = ""  # "" = off; a path = record every Submit and emitted Tokens item as a trace
    model: str = ""  # source = llama-cpp: a GGUF file ("" = SmolLM2-135M); source = vllm: vLLM's model (dir or id)
    vllm_args: list[str] = []  # source = vllm: `vllm serve` engine flags (what follows `--` on the command line)
    model_threads: AtLeastOne = 1


class WorkerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    count: AtLeastOne = 2
    heartbeat_interval_s: float = 0.2
    stats_interval_s: PositiveFloat = 1.0
    max_stop_strings: int = 64
    max_stop_string_chars: int = 1024
    max_live_stop_chars: AtLeastOne = 4_194_304  # stop-string characters over all live rids of one worker
    runaway_cpu_s: NonNegativeFloat = 5.0  # CPU one request's ids (or Open) may take before it ends with an error


class FrontConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    host: str = "127.0.0.1"
    port: Port = 8000
    model_name: str = ""  # "" = derived from the tokenizer name
    model_aliases: list[str] = []  # more names requests may give for the model (responses carry model_name)
    lora_adapters: dict[str, str] = {}  # LoRA adapter name -> its path: served as models (source = vllm only)
    runtime_lora_updating: bool = False  # /v1/load_lora_adapter, /v1/unload_lora_adapter (source = vllm only)
    api_key: str = ""  # "" = no auth
    api_keys: list[str] = []  # keys of which any one is accepted (vLLM's --api-key K1 K2); instead of api_key
    max_request_bytes: AtLeastOne = 4 * 1024 * 1024
    max_tokens_default: NonNegativeInt = 256  # 0 = the engine's own default (source = vllm only)
    completions_max_tokens_default: NonNegativeInt = 0  # /v1/completions' default; 0 = max_tokens_default
    max_tokens_limit: int = 32_768  # at least max_tokens_default
    max_n: AtLeastOne = 16  # choices per request (n); each is one engine request
    max_pending_chars: AtLeastOne = 1_000_000  # per-request buffer for a slow client; past it the request is aborted
    responses_store_max: NonNegativeInt = 1000  # /v1/responses kept per front (previous_response_id, GET; 0: none)
    max_total_pending_chars: AtLeastOne = 64_000_000  # over all streams; past it new requests get 503
    max_prompt_chars: AtLeastOne = 1_000_000  # characters of a prompt (all messages), checked before encoding
    max_prompt_tokens: NonNegativeInt = 0  # 0 = the tokenizer's model_max_length where known, else PROMPT_TOKENS_CAP
    request_timeout_s: NonNegativeFloat = 600.0  # 0 = none
    # chat output parsers (`resolve`): "auto" = by the tokenizer's family, "none" = off
    reasoning_parser: str = "auto"
    # the chat answer's field for the reasoning: detok's reasoning_content, or vLLM 0.32's reasoning (the default on
    # source = vllm)
    reasoning_field: Literal["reasoning_content", "reasoning"] = "reasoning_content"
    # chat usage with completion_tokens_details.reasoning_tokens, counted as vLLM's parser of that family counts
    # them (front.reasoning_parser qwen3_vllm or deepseek_r1; else 0): vLLM's server with --reasoning-parser
    reasoning_tokens_details: bool = False
    # the role of a chat answer when its prompt asks for one (add_generation_prompt; else the last message's role),
    # vLLM's --response-role
    response_role: str = "assistant"
    # logprob tokens written "token_id:<id>" for requests that do not say (their return_tokens_as_token_ids)
    return_tokens_as_token_ids: bool = False
    tool_call_parser: str = "auto"
    # how a chat tool_choice that forces calls ("required", a named function) constrains the output: "json_schema",
    # to call JSON (vLLM's schemas) that the front turns into calls; "tool_parser", to the tool-call parser's own
    # format (the engine builds it: vLLM's structural tag of --tool-call-parser; source = vllm only), read by that
    # parser. `detok serve --source vllm` picks it as vLLM's server does (its parser's supports_required_and_named)
    tool_choice_grammar: Literal["json_schema", "tool_parser"] = "json_schema"
    tools_need_parser: bool = False  # a chat request with tools is refused when no tool-call parser is on
    # chat template arguments of every request, under the request's own chat_template_kwargs (vLLM's
    # --default-chat-template-kwargs), e.g. {enable_thinking = false}
    chat_template_kwargs: dict[str, Any] = {}
    max_model_len: NonNegativeInt = 0  # 0 = tokenizer_config.json's model_max_length, when it gives one
    cors_allowed_origins: list[str] = []  # [] = no CORS headers; ["*"] = any origin
    cors_allowed_methods: list[str] = msgspec.field(default_factory=lambda: ["GET", "POST", "OPTIONS"])
    cors_allowed_headers: list[str] = msgspec.field(
        default_factory=lambda: ["Authorization", "Content-Type", "X-Request-Id"]
    )
    cors_allow_credentials: bool = False
    api_key_file: str = ""  # a file (mode 0600) holding the API key; or DETOK_API_KEY in the environment
    drain_timeout_s: NonNegativeFloat = 20.0  # SIGTERM: in-flight requests get this long to finish
    header_timeout_s: PositiveFloat = 10.0  # a request head not complete after this long: connection closed
    body_timeout_s: PositiveFloat = 60.0  # a request body not complete this long after its head: connection closed
    keep_alive_timeout_s: PositiveFloat = 5.0  # an idle keep-alive connection is closed after this long
    max_connections: AtLeastOne = 10_000  # open HTTP connections; beyond it 503 (also kept below the fd limit)
    # TLS (uvicorn's): a key and certificate file turn HTTPS on; ssl_cert_reqs is the ssl module's CERT_* value
    ssl_keyfile: str = ""
    ssl_certfile: str = ""
    ssl_ca_certs: str = ""
    ssl_cert_reqs: Annotated[int, Meta(ge=0, le=2)] = 0
    ssl_ciphers: str = ""
    # one INFO line per generation request on detok.requests: its rid, parameters and prompt ids (at most
    # max_log_len of them; 0 = all), as vLLM's --enable-log-requests / --max-log-len
    log_requests: bool = False
    max_log_len: NonNegativeInt = 0
    # with log_requests: a chat's output too (each choice's text, cut to max_log_len), and with log_deltas each
    # streamed piece (vLLM's --enable-log-outputs / --enable-log-deltas)
    log_outputs: bool = False
    log_deltas: bool = True
    force_include_usage: bool = False  # usage in every stream, stream_options or not (--enable-force-include-usage)
    openapi: bool = True  # serve /openapi.json (false: vLLM's --disable-fastapi-docs)
    uvicorn_log_level: UvicornLogLevel = ""  # uvicorn's own loggers; "" = logging.level
    # the path prefix a path-based proxy serves the front under (ASGI root_path, vLLM's --root-path): routes answer
    # with it and without it (a proxy that strips it)
    root_path: str = ""
    # an SSE comment every this many seconds a stream waits for news, and its head (200) sent after this long
    # without a first output (vLLM's --sse-keep-alive-interval): proxies with read timeouts keep the connection;
    # 0 = off (the head waits for the first output, so an admission refusal is a 4xx)
    sse_keep_alive_s: NonNegativeFloat = 0.0
    # usage.prompt_tokens_details.cached_tokens: the prompt tokens the engine's prefix cache held (vLLM's
    # --enable-prompt-tokens-details; source = vllm only)
    prompt_tokens_details: bool = False
    server_load: bool = False  # GET /load counts the generation requests in flight (else it says 0)
    access_log_skip_paths: list[str] = []  # paths whose requests the access log leaves out (e.g. /health, /metrics)
    # chat requests with tool_choice "none" render no tools into the prompt (vLLM's
    # --exclude-tools-when-tool-choice-none)
    exclude_tools_when_tool_choice_none: bool = False
    access_log: bool = True  # one INFO line per HTTP request on the detok.access logger (`RequestLogMiddleware`)
    # front processes of `detok serve`, all on host:port (SO_REUSEPORT), each with its own bus PULL
    processes: AtLeastOne = 1


class LoggingConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    level: LogLevel = "INFO"
    format: LogFormat = "human"


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
    level = tree.get("logging", {}).get("level") if isinstance(tree.get("logging"), dict) else None
    if isinstance(level, str):
        tree["logging"]["level"] = level.upper()  # logging.level is given in any case
    config = _convert(tree)
    _check_relations(config)
    if config.engine.source == "vllm" and not config.tokenizer.path:  # the model's own tokenizer
        config = msgspec.structs.replace(
            config, tokenizer=msgspec.structs.replace(config.tokenizer, path=config.engine.model)
        )
    return config


def validate(config: DetokConfig) -> None:
    """Check a config built in code as load_config checks a file: the declared constraints, then the relations."""
    _check_relations(_convert(msgspec.to_builtins(config)))


_AT = re.compile(r"^(.*) - at `\$\.([^`]*)`$")


def _convert(tree: dict[str, Any]) -> DetokConfig:
    try:
        return msgspec.convert(tree, DetokConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid config: {_explain(str(exc), tree)}") from exc


def _explain(message: str, tree: dict[str, Any]) -> str:
    """msgspec's "Expected `int` >= 1 - at `$.worker.count`" as "worker.count = 0: expected `int` >= 1", and a
    closed set's "Invalid enum value" with the values it allows."""
    at = _AT.match(message)
    if at is None:
        return message
    problem, key = at.groups()
    problem = problem[:1].lower() + problem[1:]
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return f"{key}: {problem}"
        node = node[part]
    if isinstance(node, dict):  # a section: the problem names the key in it
        return f"{key}: {problem}"
    allowed = _literal_values(key)
    if allowed:
        return f"{key} = {node!r}: must be one of {', '.join(map(str, allowed))}"
    return f"{key} = {node!r}: {problem}"


def _literal_values(key: str) -> tuple[object, ...]:
    """The values of the Literal type of the option `key` (dotted), or () when it is not a closed set."""
    kind: Any = DetokConfig
    for part in key.split("."):
        if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
            return ()
        kind = get_type_hints(kind, include_extras=True).get(part)
    return get_args(kind) if get_origin(kind) is Literal else ()


_LOCAL = ("corpus", "echo", "trace", "llama-cpp")  # the stub's sources: detok paces and batches their steps
# The options that only some engine sources read (every other option is every source's). Set to anything but its
# default with another source, an option is refused at start rather than ignored.
SOURCE_OPTIONS: dict[str, tuple[str, ...]] = {
    "engine.engine_url": ("grpc",),
    "engine.engine_service": ("grpc",),
    "engine.connect_timeout_s": ("grpc",),
    "engine.start_retries": ("grpc",),
    "engine.trace": ("trace",),
    "engine.corpus": ("corpus",),
    "engine.seed": ("corpus",),
    "engine.step_interval_ms": _LOCAL,
    "engine.max_batch": _LOCAL,
    "engine.tokens_per_step": _LOCAL,
    "engine.replay_speed": _LOCAL,
    "engine.model": ("llama-cpp", "vllm"),
    "engine.model_threads": ("llama-cpp",),
    "engine.vllm_args": ("vllm",),
    "front.lora_adapters": ("vllm",),  # LoRA adapters
    "front.runtime_lora_updating": ("vllm",),  # LoRA adapters loaded at run time
    "front.prompt_tokens_details": ("vllm",),  # the engine's cached prompt tokens
    "front.tool_choice_grammar": ("vllm",),  # tool_parser: the engine builds the tool-call grammar
}


def _check_source_options(config: DetokConfig) -> None:
    default = DetokConfig()
    source = config.engine.source
    for key, sources in SOURCE_OPTIONS.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if source not in sources and value != getattr(getattr(default, section), name):
            raise ConfigError(f"{key} = {value!r} needs engine.source = {' or '.join(sources)}, not {source}")


def _check_relations(config: DetokConfig) -> None:
    """What one option's type cannot say: options that need each other."""
    _check_source_options(config)
    engine = config.engine
    checks = [
        (engine.source != "trace" or bool(engine.trace), "engine.source = trace needs engine.trace"),
        (
            engine.source != "grpc" or engine.engine_url.startswith("grpc://"),
            "engine.source = grpc needs engine.engine_url = grpc://host:port",
        ),
        (engine.source != "vllm" or bool(engine.model), "engine.source = vllm needs engine.model"),
        (
            engine.source == "vllm" or config.front.max_tokens_default > 0,
            "front.max_tokens_default = 0 (the engine's own default) needs engine.source = vllm",
        ),
        (
            bool(config.front.ssl_keyfile) == bool(config.front.ssl_certfile),
            "front.ssl_keyfile and front.ssl_certfile go together",
        ),
        (
            config.front.max_tokens_limit >= config.front.max_tokens_default,
            f"front.max_tokens_limit = {config.front.max_tokens_limit} is below front.max_tokens_default = "
            f"{config.front.max_tokens_default}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


def parse_set_value(text: str) -> Any:
    """A --set value: a TOML literal (number, bool, quoted string, array) if it parses as one, else the raw string.
    A bare value with '#' is a string: TOML would read '123#x' as the number 123 and a comment (a CURVE key can
    look like that)."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return text if "#" in text and not isinstance(value, (str, list, dict)) else value


def config_to_toml(config: DetokConfig) -> str:
    """The full effective config as a TOML document that `load_config` reads back to an equal config."""
    header = "# effective detok configuration (every option, after files and flags)\n\n"
    return header + tomli_w.dumps(msgspec.to_builtins(config))
