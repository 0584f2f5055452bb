"""`vllm serve`'s flags on `detok serve --source vllm`: parsed once by vLLM's own parser, each front-end flag either
honoured as vLLM's server honours it (turned into detok's configuration) or refused at start with its name and the
reason. Nothing is accepted and ignored.

The engine flags (`AsyncEngineArgs`) go to the engine core as they are (vllm_source.py); the few of them that also
change what the front does (the served names, the reasoning parser, the largest logprobs, the tokenizer) are read
here too. With no flag given, the front takes vLLM's server defaults where they differ from detok's: no chat output
parsing, no request deadline, max_tokens as vLLM fills it (16 for completions, else the rest of the context capped by
the generation config: the engine computes it with vLLM's own rule). detok's own options keep working; one that is
set to another value than a vLLM flag given for the same thing stops the start, naming both.

Imports vLLM: used where vLLM is installed (the vLLM source's virtualenv), by `detok serve`, `detok config` and a
front started on its own.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import huggingface_hub
import msgspec
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.utils.argparse_utils import FlexibleArgumentParser

from detok_worker.bus.messages import MAX_TOP_LOGPROBS
from detok_worker.config import ConfigError, DetokConfig, FrontConfig, validate
from detok_worker.parse.registry import COUNTED_REASONING

VLLM_API_KEY_ENV = "VLLM_API_KEY"
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# vLLM's LoRA resolver plugins: a request naming an unknown model loads an adapter of that name from there
LORA_RESOLVER_ENVS = ("VLLM_LORA_RESOLVER_CACHE_DIR", "VLLM_LORA_RESOLVER_HF_REPO_LIST")
# vLLM's parser names -> detok's parser of the same output format
REASONING_PARSERS = {
    "qwen3": "qwen3_vllm", "deepseek_r1": "deepseek_r1", "deepseek_v3": "deepseek_v3", "openai_gptoss": "gpt_oss",
    "glm45": "glm45", "glm47": "glm45", "kimi_k2": "kimi_k2", "minimax_m2": "minimax_m2",
    "minimax_m2_append_think": "minimax_m2_append_think", "olmo3": "olmo3", "granite": "granite",
}  # fmt: skip
TOOL_CALL_PARSERS = {
    "hermes": "hermes", "llama3_json": "llama3_json", "mistral": "mistral", "openai": "gpt_oss",
    "deepseek_v31": "deepseek_v31",
    "qwen3_coder": "qwen3_coder", "qwen3_xml": "qwen3_coder", "glm45": "glm45", "glm47": "glm47",
    "minimax_m2": "minimax_m2",
    "kimi_k2": "kimi_k2",
    "deepseek_v32": "deepseek_v32",
}  # fmt: skip
COMPLETIONS_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
# vLLM clamps max_tokens to the context instead of refusing it: detok's front refuses only what no context holds
MAX_TOKENS_LIMIT = 2**31 - 1

Overrides = dict[str, Any]
Flag = Callable[[Any, argparse.Namespace], Overrides]


def _to(key: str) -> Flag:
    return lambda value, _args: {key: value}


def _api_keys(value: list[str], _args: argparse.Namespace) -> Overrides:
    return {"front.api_keys": [key for key in value if key]}


def _cors(_value: Any, args: argparse.Namespace) -> Overrides:
    """Any of the four: vLLM's CORS, its defaults for the others (every method and header)."""
    return {
        "front.cors_allowed_origins": list(args.allowed_origins),
        "front.cors_allowed_methods": list(args.allowed_methods),
        "front.cors_allowed_headers": list(args.allowed_headers),
        "front.cors_allow_credentials": bool(args.allow_credentials),
    }


def _parser(table: Mapping[str, str], key: str, flag: str) -> Flag:
    def overrides(value: str, _args: argparse.Namespace) -> Overrides:
        if value not in table:
            known = ", ".join(sorted(table))
            raise ConfigError(f"{flag} {value}: detok has no parser for this output format (it has: {known})")
        return {key: table[value]}

    return overrides


def _tool_call_parser(value: str, args: argparse.Namespace) -> Overrides:
    """The front parses tool calls (and turns a forcing tool_choice into tool calls) only with
    --enable-auto-tool-choice, as vLLM's server; a parser detok does not have is refused either way. Where vLLM
    constrains forced calls to the parser's own format (its structural tag), the engine builds that grammar."""
    overrides = _parser(TOOL_CALL_PARSERS, "front.tool_call_parser", "--tool-call-parser")(value, args)
    if not args.enable_auto_tool_choice:
        return {}
    parser = ToolParserManager.get_tool_parser(value)
    if parser.structural_tag_model is not None and not parser.supports_required_and_named:
        overrides["front.tool_choice_grammar"] = "tool_parser"
    return overrides


def _reasoning_parser(value: str, args: argparse.Namespace) -> Overrides:
    """The front's parser of that family, and the usage's reasoning tokens where detok counts them as vLLM does."""
    overrides = _parser(REASONING_PARSERS, "front.reasoning_parser", "--reasoning-parser")(value, args)
    overrides["front.reasoning_tokens_details"] = overrides["front.reasoning_parser"] in COUNTED_REASONING
    return overrides


def _served_names(value: list[str], _args: argparse.Namespace) -> Overrides:
    return {"front.model_name": value[0], "front.model_aliases": list(value[1:])}


def _max_logprobs(value: int, _args: argparse.Namespace) -> Overrides:
    if value > MAX_TOP_LOGPROBS:
        raise ConfigError(f"--max-logprobs {value}: detok returns at most {MAX_TOP_LOGPROBS} top logprobs per token")
    return {}


def _lora_adapters(value: list[Any], _args: argparse.Namespace) -> Overrides:
    """vLLM's LoRAModulePath list: the front serves each name (the engine loads them from the same flag)."""
    return {"front.lora_adapters": {module.name: module.path for module in value}}


def _tokenizer_revision(_value: str, args: argparse.Namespace) -> Overrides:
    """The tokenizer's Hub revision, as vLLM picks it: --tokenizer-revision, else --revision."""
    return {"tokenizer.revision": args.tokenizer_revision or args.revision}


def _tokenizer_mode(value: str, _args: argparse.Namespace) -> Overrides:
    if value not in ("auto", "hf"):
        raise ConfigError(f"--tokenizer-mode {value}: detok picks the tokenizer's kind from its files (auto)")
    return {}


def _nothing(_value: Any, _args: argparse.Namespace) -> Overrides:
    return {}


def _model_tag(value: str, args: argparse.Namespace) -> Overrides:
    if value != args.model:
        raise ConfigError(f"the model {value!r} after -- differs from --model {args.model!r}; give it once")
    return {}


# front-end flags detok honours: flag dest -> the config it means
HONOURED: dict[str, Flag] = {
    "model_tag": _model_tag,  # `vllm serve MODEL`: the same as --model
    "config": _nothing,  # vLLM's YAML of flags: its parser has already read them in
    "api_server_count": _to("front.processes"),
    "api_key": _api_keys,
    "host": _to("front.host"),
    "port": _to("front.port"),
    "ssl_keyfile": _to("front.ssl_keyfile"),
    "ssl_certfile": _to("front.ssl_certfile"),
    "ssl_ca_certs": _to("front.ssl_ca_certs"),
    "ssl_cert_reqs": _to("front.ssl_cert_reqs"),
    "ssl_ciphers": _to("front.ssl_ciphers"),
    "allowed_origins": _cors,
    "allowed_methods": _cors,
    "allowed_headers": _cors,
    "allow_credentials": _cors,
    "chat_template": _to("tokenizer.chat_template"),
    "lora_modules": _lora_adapters,
    "default_chat_template_kwargs": _to("front.chat_template_kwargs"),
    "response_role": _to("front.response_role"),
    "root_path": lambda value, _args: {"front.root_path": value or ""},
    "sse_keep_alive_interval": lambda value, _args: {"front.sse_keep_alive_s": float(value)},
    "enable_prompt_tokens_details": _to("front.prompt_tokens_details"),
    "return_tokens_as_token_ids": _to("front.return_tokens_as_token_ids"),
    "tool_call_parser": _tool_call_parser,
    "enable_auto_tool_choice": _nothing,  # read with --tool-call-parser (vLLM's own check: not without it)
    # the engine builds the tool-call grammar with it, by vLLM's parser classes (vllm_tool_grammar.py)
    "tool_strict_level": _nothing,
    # the engine process makes vLLM's system_fingerprint with them (vllm_source.py); the fronts write it
    "fingerprint_mode": _nothing,
    "fingerprint_value": _nothing,
    "disable_uvicorn_access_log": lambda value, _args: {"front.access_log": not value},
    "max_log_len": _to("front.max_log_len"),
    "disable_fastapi_docs": lambda value, _args: {"front.openapi": not value},
    "enable_force_include_usage": _to("front.force_include_usage"),
    "uvicorn_log_level": _to("front.uvicorn_log_level"),
    "disable_access_log_for_endpoints": lambda value, _args: {
        "front.access_log_skip_paths": [path.strip() for path in value.split(",") if path.strip()]
    },
    "exclude_tools_when_tool_choice_none": _to("front.exclude_tools_when_tool_choice_none"),
    "enable_server_load_tracking": _to("front.server_load"),
    "enable_request_id_headers": _nothing,  # detok's responses always carry X-Request-Id
    "enable_log_outputs": _to("front.log_outputs"),
    "enable_log_deltas": _to("front.log_deltas"),
}
# engine flags the front honours too (they also go to the engine core)
FRONT_ENGINE_FLAGS: dict[str, Flag] = {
    "served_model_name": _served_names,
    "reasoning_parser": _reasoning_parser,
    "max_logprobs": _max_logprobs,  # vLLM's input processing refuses more than this per request
    "tokenizer": _to("tokenizer.path"),
    "enable_log_requests": _to("front.log_requests"),
    "revision": _tokenizer_revision,
    "tokenizer_revision": _tokenizer_revision,
    "tokenizer_mode": _tokenizer_mode,
}
_NO_MULTIMODAL = "detok serves text only: no multimodal input"
_NO_ENDPOINT = "detok serves no such endpoint"
# front-end flags detok refuses, and why
REFUSED: dict[str, str] = {
    "headless": "--headless runs engine cores without a front end; start them with `vllm serve --headless`",
    "grpc": "for vLLM's gRPC server use `vllm serve --grpc` and `detok serve --source grpc`",
    "grpc_port": "the Rust front end's gRPC services are not detok's",
    "chat_template_content_format": "detok renders message content as the template's own format only",
    "trust_request_chat_template": "detok does not render chat templates sent in requests",
    "trust_request_mm_kwargs": _NO_MULTIMODAL,
    "tool_parser_plugin": "detok loads no parser plugins",
    "tool_server": "detok runs no built-in tools",
    "enable_per_request_metrics": "detok does not add timing metrics to responses",
    "enable_tokenizer_info_endpoint": _NO_ENDPOINT + " (/tokenizer_info)",
    "cohere_is_reasoning_model": _NO_ENDPOINT + " (/cohere)",
    "cohere_format": _NO_ENDPOINT + " (/cohere)",
    "anthropic_disabled_thinking_effort": _NO_ENDPOINT + " (/v1/messages)",
    "log_error_stack": "detok logs no stack traces of error responses",
    "enable_scale_out": _NO_ENDPOINT + " (/render, /inference/v1/generate)",
    "data_parallel_supervisor_port": "detok has no multi-port external load balancing mode",
    "dp_supervisor_probe_interval_s": "detok has no multi-port external load balancing mode",
    "dp_supervisor_probe_timeout_s": "detok has no multi-port external load balancing mode",
    "dp_supervisor_probe_failure_threshold": "detok has no multi-port external load balancing mode",
    "uds": "detok's front listens on TCP only",
    "enable_ssl_refresh": "detok does not reload TLS certificates while it runs",
    "middleware": "detok runs no ASGI middleware from import paths",
    "h11_max_incomplete_event_size": "detok's HTTP limits are front.max_request_bytes and its head/body deadlines",
    "h11_max_header_count": "detok's HTTP limits are front.max_request_bytes and its head/body deadlines",
    "enable_offline_docs": "detok serves no documentation pages",
    "enable_flash_late_interaction": "detok serves no pooling or scoring",
}
# engine flags detok refuses: what they ask of the server is not done by detok
REFUSED_ENGINE_FLAGS: dict[str, str] = {
    "tokens_only": _NO_ENDPOINT + " (the tokens-in, tokens-out API)",
    "otlp_traces_endpoint": "detok exports no OpenTelemetry traces",
}


def serve_parser() -> FlexibleArgumentParser:
    """`vllm serve`'s parser, as vLLM builds it."""
    return make_arg_parser(FlexibleArgumentParser())


def given_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The flags whose value is not vLLM's default (by dest)."""
    return {
        action.dest: value
        for action in parser._actions
        if action.dest != "help" and (value := getattr(args, action.dest, None)) != action.default
    }


def front_overrides(model: str, vllm_args: list[str], environ: Mapping[str, str]) -> tuple[Overrides, Overrides]:
    """(what the given flags set, vLLM's defaults where detok's differ), as dotted config keys; ConfigError for
    a refused flag, naming it."""
    parser = serve_parser()
    try:
        args = parser.parse_args(["--model", model, *vllm_args])
    except SystemExit as exc:  # argparse has printed why
        raise ConfigError(f"vLLM's parser refused the flags after -- (exit {exc.code})") from None
    try:
        validate_parsed_serve_args(args)  # vLLM's own start-up checks of the serve flags
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"vllm serve flags: {exc}") from exc
    given = given_flags(parser, args)
    refusals = {**REFUSED, **REFUSED_ENGINE_FLAGS}
    refused = [f"--{dest.replace('_', '-')}: {refusals[dest]}" for dest in given if dest in refusals]
    if refused:
        raise ConfigError("vllm serve flags detok does not honour: " + "; ".join(refused))
    flags: Overrides = {}
    for dest, value in given.items():
        honour = HONOURED.get(dest) or FRONT_ENGINE_FLAGS.get(dest)
        if honour is not None:
            flags.update(honour(value, args))
    if "api_key" not in given and environ.get(VLLM_API_KEY_ENV):
        flags["front.api_keys"] = [environ[VLLM_API_KEY_ENV]]
    if runtime_lora_updating(environ):
        resolvers = [name for name in LORA_RESOLVER_ENVS if environ.get(name)]
        if resolvers:
            raise ConfigError(
                f"{', '.join(resolvers)}: detok does not resolve LoRA adapters by the model a request names; load "
                "them with /v1/load_lora_adapter or --lora-modules"
            )
        flags["front.runtime_lora_updating"] = True
    defaults: Overrides = {
        "front.reasoning_parser": "none",
        "front.tool_call_parser": "none",
        "front.reasoning_field": "reasoning",
        "front.request_timeout_s": 0.0,
        "front.max_tokens_default": 0,
        "front.completions_max_tokens_default": COMPLETIONS_MAX_TOKENS,
        "front.max_tokens_limit": MAX_TOKENS_LIMIT,
        # vLLM's server refuses more stop strings than this (VLLM_MAX_STOP_STRINGS, as vLLM reads it)
        "worker.max_stop_strings": int(environ.get("VLLM_MAX_STOP_STRINGS", "4")),
        # vLLM's server refuses tools it cannot parse, but for gpt-oss, whose calls it reads through Harmony
        "front.tools_need_parser": model_type(args.model, args.revision) != "gpt_oss",
    }
    return flags, defaults


def model_type(model: str, revision: str | None) -> str:
    """The model's config.json `model_type` (a local directory, or the Hugging Face cache); "" when not found."""
    path = Path(model) / "config.json"
    if not path.is_file():
        try:
            cached = huggingface_hub.try_to_load_from_cache(model, "config.json", revision=revision)
        except ValueError:  # not a repository id either
            return ""
        if not isinstance(cached, str):
            return ""
        path = Path(cached)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return str(config.get("model_type", "")) if isinstance(config, dict) else ""


def runtime_lora_updating(environ: Mapping[str, str]) -> bool:
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING as vLLM reads it (vllm.envs: "1" or "true", any case)."""
    return environ.get(RUNTIME_LORA_ENV, "0").strip().lower() in ("1", "true")


def apply_vllm_flags(config: DetokConfig, environ: Mapping[str, str] | None = None) -> DetokConfig:
    """The config with `engine.vllm_args`' front-end flags and vLLM's defaults applied (source = vllm); raises
    ConfigError naming a refused flag, or a detok option set to another value than a vLLM flag."""
    environ = os.environ if environ is None else environ
    flags, defaults = front_overrides(config.engine.model, list(config.engine.vllm_args), environ)
    tree = msgspec.to_builtins(config)
    conflicts = []
    for key, value in flags.items():
        current = _get(tree, key)
        if current not in _unset(key, config) and current != msgspec.to_builtins(value):
            conflicts.append(f"{key} = {current!r} but the vLLM flags give {value!r}")
        _set(tree, key, value)
    if conflicts:
        raise ConfigError("detok's options and the vllm serve flags disagree: " + "; ".join(conflicts))
    for key, value in defaults.items():
        if key not in flags and _get(tree, key) in _unset(key, config):
            _set(tree, key, value)
    try:
        result = msgspec.convert(tree, DetokConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"a vllm serve flag gives an invalid value: {exc}") from exc
    validate(result)
    return result


def _get(tree: dict[str, Any], key: str) -> Any:
    section, name = key.split(".")
    return tree[section][name]


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    section, name = key.split(".")
    tree[section][name] = msgspec.to_builtins(value)


def _unset(key: str, config: DetokConfig) -> list[Any]:
    """The values of an option that say nothing: its default (and the tokenizer path load_config fills in)."""
    section, name = key.split(".")
    defaults = DetokConfig()
    struct = {"front": FrontConfig(), "tokenizer": defaults.tokenizer, "worker": defaults.worker}[section]
    unset = [msgspec.to_builtins(getattr(struct, name))]
    return [*unset, config.engine.model] if key == "tokenizer.path" else unset
