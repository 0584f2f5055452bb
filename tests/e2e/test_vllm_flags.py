"""`detok serve --source vllm -- FLAGS` as a drop-in for `vllm serve M FLAGS`: every front-end flag of the installed
vLLM is honoured or refused at start by name (engine/vllm_flags.py), and vLLM's own server and detok, started on the
same flags, answer the same seeded requests that leave sampling and max_tokens to the server's defaults with the same
ids (vLLM's generation-config defaults, its max_tokens rule), guard /v1 with the same keys and serve the same names.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomllib
from helpers.serve_helpers import REPO, children_of, named_sse_events, pid_alive, wait_for
from helpers.tokenizer_files import reference_hf_tokenizer
from helpers.vllm_cpu import (
    ENV,
    LOG_EVERY_SECOND,
    SERVED_NAME,
    STATS_LINE,
    detok_vllm,
    lora_adapter,
    model_with_sampling_defaults,
    require_venv,
    vllm_server,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(900)


def run_in_venv(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, **ENV, **(env or {}), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [str(require_venv()), *argv], capture_output=True, text=True, cwd=REPO, env=environ, timeout=300
    )


# `detok config` / `detok serve` invocations that only read the flags, each (argv, extra environment): run in one
# vLLM interpreter (`cli_runs`), since importing vLLM costs seconds per process
FRONT_FLAGS = (
    "--api-key", "k1", "k2", "--served-model-name", "a", "b", "--port", "8123", "--host", "0.0.0.0",
    "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--reasoning-parser", "qwen3",
    "--allowed-origins", '["https://app.example"]', "--api-server-count", "2", "--disable-uvicorn-access-log",
    "--ssl-keyfile", "/k.pem", "--ssl-certfile", "/c.pem", "--chat-template", "{{ messages }}",
    "--default-chat-template-kwargs", '{"enable_thinking": false}', "--enable-log-requests", "--max-log-len", "64",
    "--enable-force-include-usage", "--disable-fastapi-docs", "--uvicorn-log-level", "warning",
    "--revision", "main", "--tokenizer-revision", "v2", "--disable-access-log-for-endpoints", "/health,/metrics",
    "--exclude-tools-when-tool-choice-none", "--enable-server-load-tracking", "--response-role", "bot",
    "--return-tokens-as-token-ids", "--root-path", "/llm", "--enable-prompt-tokens-details",
    "--enable-log-outputs", "--no-enable-log-deltas",
)  # fmt: skip
REFUSED_FLAGS = [
    (("--uds", "/tmp/detok.sock"), "--uds"),
    (("--middleware", "my.module:mw"), "--middleware"),
    (("--enable-auto-tool-choice",), "--enable-auto-tool-choice requires --tool-call-parser"),  # vLLM's check
    (("--tool-call-parser", "pythonic"), "--tool-call-parser pythonic"),
    (("--enable-per-request-metrics",), "--enable-per-request-metrics"),
    (("--tokenizer-mode", "mistral"), "--tokenizer-mode mistral"),
]


# a model directory whose config names the gpt-oss family (vLLM's server reads its tool calls through Harmony)
GPT_OSS_MODEL = Path(tempfile.mkdtemp(prefix="detok-gpt-oss-"))
(GPT_OSS_MODEL / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))


def config_argv(*flags: str, detok: tuple[str, ...] = ()) -> tuple[str, ...]:
    return ("config", "--source", "vllm", "--model", "/models/m", *detok, "--", *flags)


CLI_CASES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "front flags": (config_argv(*FRONT_FLAGS), {}),
    "no flags": (config_argv(), {}),
    "more stop strings": (config_argv(), {"VLLM_MAX_STOP_STRINGS": "9"}),
    "gpt-oss model": (("config", "--source", "vllm", "--model", str(GPT_OSS_MODEL), "--"), {}),
    "parser without auto tool choice": (config_argv("--tool-call-parser", "hermes"), {}),
    "mistral parser": (config_argv("--tool-call-parser", "mistral", "--enable-auto-tool-choice"), {}),
    "key from the environment": (config_argv(), {"VLLM_API_KEY": "from-env"}),
    "key flag and environment": (config_argv("--api-key", "flag"), {"VLLM_API_KEY": "from-env"}),
    "disagreeing port": (config_argv("--port", "8123", detok=("--port", "9000")), {}),
    "runtime lora updating": (config_argv(), {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}),
    "runtime lora updating off": (config_argv(), {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "yes"}),
    "lora resolver": (
        config_argv(),
        {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "VLLM_LORA_RESOLVER_CACHE_DIR": "/adapters"},
    ),
    **{f"refused {named}": (config_argv(*flags), {}) for flags, named in REFUSED_FLAGS},
}
CLI_SCRIPT = """
import contextlib, io, json, os, sys
from detok_worker.cli.main import main
out = {}
for name, (argv, env) in json.loads(sys.argv[1]).items():
    saved = dict(os.environ)
    os.environ.update(env)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    os.environ.clear()
    os.environ.update(saved)
    out[name] = [code, stdout.getvalue(), stderr.getvalue()]
import dataclasses
from vllm.engine.arg_utils import AsyncEngineArgs
from detok_worker.engine.vllm_flags import HONOURED, REFUSED, serve_parser
engine_args = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
front_end = {action.dest for action in serve_parser()._actions if action.dest not in ("help", *engine_args)}
# the installed vLLM's front-end flags in neither table, and entries of the tables that vLLM no longer has
unclassified = front_end ^ (set(HONOURED) | set(REFUSED))
print(json.dumps({"runs": out, "unclassified": sorted(unclassified)}))
"""


@pytest.fixture(scope="module")
def cli_outcome() -> dict[str, Any]:
    """In one vLLM interpreter: each CLI_CASES invocation's (exit code, stdout, stderr), and the installed vLLM's
    front-end flags in neither of detok's tables."""
    result = run_in_venv("-c", CLI_SCRIPT, json.dumps(CLI_CASES))
    assert result.returncode == 0, result.stderr[-3000:]
    outcome: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return outcome


@pytest.fixture(scope="module")
def cli_runs(cli_outcome: dict[str, Any]) -> dict[str, tuple[int, str, str]]:
    return {name: tuple(run) for name, run in cli_outcome["runs"].items()}


def effective_config(cli_runs: dict[str, tuple[int, str, str]], case: str) -> dict[str, Any]:
    code, stdout, stderr = cli_runs[case]
    assert code == 0, stderr[-3000:]
    return tomllib.loads(stdout)


def test_every_front_end_flag_of_the_installed_vllm_is_honoured_or_refused(cli_outcome: dict[str, Any]) -> None:
    assert cli_outcome["unclassified"] == []


def test_front_end_flags_set_the_fronts_options(cli_runs: dict[str, tuple[int, str, str]]) -> None:
    front = effective_config(cli_runs, "front flags")
    config = front["front"]
    assert config["api_keys"] == ["k1", "k2"]
    assert (config["model_name"], config["model_aliases"]) == ("a", ["b"])
    assert (config["host"], config["port"], config["processes"]) == ("0.0.0.0", 8123, 2)
    assert (config["tool_call_parser"], config["reasoning_parser"]) == ("hermes", "qwen3_vllm")  # vLLM 0.32's qwen3
    assert config["reasoning_tokens_details"] is True
    assert config["cors_allowed_origins"] == ["https://app.example"]
    assert (config["cors_allowed_methods"], config["cors_allowed_headers"]) == (["*"], ["*"])  # vLLM's defaults
    assert config["access_log"] is False
    assert (config["ssl_keyfile"], config["ssl_certfile"]) == ("/k.pem", "/c.pem")
    assert front["tokenizer"]["chat_template"] == "{{ messages }}"
    assert front["tokenizer"]["revision"] == "v2"  # --tokenizer-revision over --revision, as vLLM
    assert config["access_log_skip_paths"] == ["/health", "/metrics"]
    assert config["exclude_tools_when_tool_choice_none"] is True
    assert config["server_load"] is True
    assert config["chat_template_kwargs"] == {"enable_thinking": False}
    assert (config["log_requests"], config["max_log_len"], config["force_include_usage"]) == (True, 64, True)
    assert (config["openapi"], config["uvicorn_log_level"]) == (False, "warning")
    assert (config["response_role"], config["return_tokens_as_token_ids"], config["root_path"]) == ("bot", True, "/llm")
    assert config["prompt_tokens_details"] is True
    assert (config["log_outputs"], config["log_deltas"]) == (True, False)


def test_with_no_flags_the_front_takes_vllms_server_defaults(cli_runs: dict[str, tuple[int, str, str]]) -> None:
    config = effective_config(cli_runs, "no flags")["front"]
    assert (config["reasoning_parser"], config["tool_call_parser"]) == ("none", "none")
    assert config["reasoning_field"] == "reasoning"  # vLLM 0.32's name
    assert config["request_timeout_s"] == 0.0
    assert (config["max_tokens_default"], config["completions_max_tokens_default"]) == (0, 16)
    assert config["api_keys"] == [] and config["cors_allowed_origins"] == []
    assert config["tools_need_parser"] is True  # vLLM's server refuses tools without --enable-auto-tool-choice
    assert effective_config(cli_runs, "no flags")["worker"]["max_stop_strings"] == 4  # VLLM_MAX_STOP_STRINGS
    assert effective_config(cli_runs, "more stop strings")["worker"]["max_stop_strings"] == 9
    assert effective_config(cli_runs, "gpt-oss model")["front"]["tools_need_parser"] is False  # read via Harmony


def test_a_tool_call_parser_parses_only_with_auto_tool_choice(cli_runs: dict[str, tuple[int, str, str]]) -> None:
    """vLLM's server parses tool calls (and turns a forcing tool_choice into tool_calls) only with
    --enable-auto-tool-choice: without it, --tool-call-parser leaves the front's parsing off."""
    assert effective_config(cli_runs, "parser without auto tool choice")["front"]["tool_call_parser"] == "none"


def test_forced_calls_take_the_tool_parsers_grammar_where_vllms_parser_has_one(
    cli_runs: dict[str, tuple[int, str, str]],
) -> None:
    """hermes has a structural tag in vLLM (the engine builds it); mistral's forced calls are JSON, as in vLLM."""
    cases = ("front flags", "mistral parser", "parser without auto tool choice")
    grammar = {case: effective_config(cli_runs, case)["front"]["tool_choice_grammar"] for case in cases}
    assert grammar["front flags"] == "tool_parser"
    assert grammar["mistral parser"] == grammar["parser without auto tool choice"] == "json_schema"


def test_vllm_api_key_from_the_environment_guards_the_front_and_the_flag_wins(
    cli_runs: dict[str, tuple[int, str, str]],
) -> None:
    assert effective_config(cli_runs, "key from the environment")["front"]["api_keys"] == ["from-env"]
    assert effective_config(cli_runs, "key flag and environment")["front"]["api_keys"] == ["flag"]


def test_runtime_lora_updating_follows_vllms_variable_and_resolvers_are_refused(
    cli_runs: dict[str, tuple[int, str, str]],
) -> None:
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING as vLLM reads it ("1" or "true"); its LoRA resolvers, which load an adapter
    by the model a request names, stop the start."""
    assert effective_config(cli_runs, "runtime lora updating")["front"]["runtime_lora_updating"] is True
    assert effective_config(cli_runs, "runtime lora updating off")["front"]["runtime_lora_updating"] is False
    assert effective_config(cli_runs, "no flags")["front"]["runtime_lora_updating"] is False
    code, _, stderr = cli_runs["lora resolver"]
    assert code != 0 and "VLLM_LORA_RESOLVER_CACHE_DIR" in stderr


def test_a_detok_option_that_disagrees_with_a_vllm_flag_stops_the_start(
    cli_runs: dict[str, tuple[int, str, str]],
) -> None:
    code, _, stderr = cli_runs["disagreeing port"]
    assert code != 0
    assert "front.port = 9000 but the vLLM flags give 8123" in stderr


@pytest.mark.parametrize(("flags", "named"), REFUSED_FLAGS, ids=[named for _, named in REFUSED_FLAGS])
def test_a_refused_flag_stops_the_start_naming_it(
    cli_runs: dict[str, tuple[int, str, str]], flags: tuple[str, ...], named: str
) -> None:
    code, stdout, stderr = cli_runs[f"refused {named}"]
    assert code != 0
    assert named in stderr, stderr[-2000:]
    assert stdout == ""


def test_detok_serve_with_a_refused_flag_starts_no_process() -> None:
    """The refusal comes before any process starts (the supervisor's first lines name none)."""
    result = run_in_venv(
        "-m", "detok_worker.cli", "serve", "--source", "vllm", "--model", "/models/m", "--port", "0",
        "--", "--middleware", "my.module:mw",
    )  # fmt: skip
    assert result.returncode != 0
    assert "--middleware" in result.stderr, result.stderr[-2000:]
    assert "detok serving at" not in result.stdout


def shared_flags() -> tuple[str, ...]:
    """The same flags to both servers: two keys, two served names, a LoRA adapter, a short context (chat's default
    max_tokens is the rest of it), streams sent every 4 ids, the usage's cached prompt tokens, a reasoning parser,
    a tool-call parser (with a structural tag in vLLM: forced calls are written in its own format)."""
    return (
        "--api-key", "key-one", "key-two", "--served-model-name", "first", "second", "--max-model-len", "256",
        "--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"adapter={lora_adapter()}",
        "--stream-interval", "4", "--enable-prompt-tokens-details", "--reasoning-parser", "qwen3",
        "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
    )  # fmt: skip


PROMPT = "Story number 3:"
CHAT = [{"role": "user", "content": "Hi"}]
LONG_PROMPT = " ".join(f"word{index}" for index in range(60))


def whitespace_bias() -> dict[str, int]:
    """A logit bias against the tokens that are only whitespace: a tool call's JSON may hold any whitespace, which
    random weights would otherwise write until max_tokens; the grammar still picks one where nothing else fits."""
    tokenizer = reference_hf_tokenizer("qwen3")
    texts = ((token_id, tokenizer.decode([token_id])) for token_id in range(tokenizer.get_vocab_size()))
    return {str(token_id): -100 for token_id, text in texts if text and not text.strip() and "\ufffd" not in text}


# a strict tool whose arguments the grammar pins to a few tokens; thinking off, so the grammar holds from the start
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TOOL_CHAT = {
    "messages": CHAT,
    "tools": [WEATHER],
    "chat_template_kwargs": {"enable_thinking": False},
    "logit_bias": whitespace_bias(),
}
NAMED = {"type": "function", "function": {"name": "weather"}}
DEVELOPER_CHAT = [
    {"role": "system", "content": "Be kind."},
    {"role": "user", "content": "Hi"},
    {"role": "developer", "content": [{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}]},
    {"role": "user", "content": "Again"},
]
TOOL_HISTORY = [
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":  "Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": '{"city": '}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
]
ON_ADAPTER = {"prompt": PROMPT, "seed": 14, "max_tokens": 8}
SAME_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    # sampling and max_tokens left to the server: the generation config's defaults, vLLM's max_tokens rule
    ("/v1/completions", {"model": "first", "prompt": PROMPT, "seed": 3}),  # max_tokens: vLLM's 16
    ("/v1/completions", {"model": "second", "prompt": PROMPT, "seed": 4, "max_tokens": 40}),
    ("/v1/completions", {"model": "first", "prompt": PROMPT, "seed": 5, "max_tokens": 256}),  # cut to the context
    ("/v1/chat/completions", {"model": "second", "messages": CHAT, "seed": 6}),  # the rest of the context
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "龘😀"}], "seed": 7, "max_tokens": 30}),
    # sampling given, n, logprobs, echo, streams
    ("/v1/chat/completions", {"messages": CHAT, "seed": 8, "max_tokens": 12, "temperature": 0.9, "top_p": 0.8}),
    ("/v1/completions", {"prompt": PROMPT, "seed": 9, "max_tokens": 8, "n": 2}),
    ("/v1/completions", {"prompt": PROMPT, "seed": 10, "max_tokens": 6, "logprobs": 2, "echo": True}),
    (
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "seed": 11,
            "max_tokens": 6,
            "logprobs": True,
            "top_logprobs": 2,
            "return_prompt_text": True,
        },
    ),
    ("/v1/completions", {"prompt": PROMPT, "seed": 12, "max_tokens": 10, "stream": True, "n": 2}),
    ("/v1/completions", {"model": "adapter", **ON_ADAPTER}),  # on the LoRA adapter
    # a request's own stream_interval above the server's 4
    (
        "/v1/chat/completions",
        {"messages": CHAT, "seed": 13, "stream": True, "stream_options": {"include_usage": True}, "stream_interval": 6},
    ),
    ("/v1/completions", {"prompt": [PROMPT, "Once upon a time"], "seed": 15, "max_tokens": 6, "n": 2}),  # a batch
    # the fingerprint on the end; the rendered prompt on the first chunk
    (
        "/v1/chat/completions",
        {"messages": CHAT, "seed": 16, "max_tokens": 4, "stream": True, "return_prompt_text": True},
    ),
    ("/v1/completions", {"prompt": PROMPT, "seed": 22, "max_tokens": 4, "vllm_xargs": {"note": "x", "k": [1, 2]}}),
    # a batch streamed: every prompt's choices in one stream
    (
        "/v1/completions",
        {
            "prompt": [PROMPT, "Once upon a time"],
            "seed": 23,
            "max_tokens": 6,
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ),
    # the messages a template gets: developer ones as system ones (Qwen3's template has no developer role), the
    # history's tool call arguments as objects (whatever their spacing, a broken one as {})
    (
        "/v1/chat/completions",
        {"messages": DEVELOPER_CHAT, "seed": 24, "max_tokens": 2, "return_prompt_text": True},
    ),
    (
        "/v1/chat/completions",
        {"messages": TOOL_HISTORY, "seed": 25, "max_tokens": 2, "return_prompt_text": True},
    ),
    # vLLM's qwen3 parser reads enable_thinking, not the prompt: a continued answer reasons (though the template
    # closed its think block), a continued user message with thinking off is all content
    (
        "/v1/chat/completions",
        {
            "messages": [*CHAT, {"role": "assistant", "content": "Sure,"}],
            "add_generation_prompt": False,
            "continue_final_message": True,
            "seed": 26,
            "max_tokens": 3,
        },
    ),
    (
        "/v1/chat/completions",
        {
            "messages": CHAT,
            "add_generation_prompt": False,
            "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": False},
            "seed": 27,
            "max_tokens": 3,
        },
    ),
    # the logprobs of given ids at each position, in place of the top candidates
    ("/v1/completions", {"prompt": PROMPT, "seed": 28, "max_tokens": 3, "logprobs": 1, "logprob_token_ids": [9707, 0]}),
    # stop token ids beside the model's EOS ids (the stop strings' limit does not count them)
    ("/v1/chat/completions", {"messages": CHAT, "seed": 29, "max_tokens": 8, "stop_token_ids": [11, 13, 220]}),
    # a streamed echo with logprobs: the prompt's logprobs come first (vLLM: the prompt and the first token in one
    # chunk; detok: the echoed prompt's chunk, then the output's)
    ("/v1/completions", {"prompt": PROMPT, "seed": 30, "max_tokens": 4, "logprobs": 1, "echo": True, "stream": True}),
    # a long prompt twice: the second finds its blocks in the prefix cache (usage.prompt_tokens_details)
    ("/v1/completions", {"prompt": LONG_PROMPT, "seed": 17, "max_tokens": 2}),
    ("/v1/completions", {"prompt": LONG_PROMPT, "seed": 18, "max_tokens": 2}),
    # tool_choice required, named (streamed) and auto
    (
        "/v1/chat/completions",
        {**TOOL_CHAT, "seed": 19, "max_tokens": 60, "tool_choice": "required", "parallel_tool_calls": False},
    ),
    ("/v1/chat/completions", {**TOOL_CHAT, "seed": 20, "max_tokens": 60, "stream": True, "tool_choice": NAMED}),
    ("/v1/chat/completions", {**TOOL_CHAT, "seed": 21, "max_tokens": 8, "parallel_tool_calls": False}),
]


def rounded(values: list[float | None] | None) -> list[float | None] | None:
    return None if values is None else [None if value is None else round(value, 3) for value in values]


def given(fields: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fields that hold a value, nested ones too (vLLM also writes the ones it leaves empty as null)."""
    if fields is None:
        return None
    return {
        name: given(value) if isinstance(value, dict) else value for name, value in fields.items() if value is not None
    }


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """A whole answer as compared: each choice's text, ids, finish and sampled logprobs, and the usage."""
    choices = []
    for choice in sorted(data["choices"], key=lambda choice: choice["index"]):
        calls = choice.get("message", {}).get("tool_calls") or []
        logprobs = choice.get("logprobs")
        if logprobs and "content" in logprobs:  # chat: the sampled tokens (top candidates tie on random weights)
            logprobs = [(entry["token"], round(entry["logprob"], 3)) for entry in logprobs["content"]]
        elif logprobs:
            tops = [sorted(top) if top else top for top in logprobs["top_logprobs"]]
            logprobs = (logprobs["tokens"], rounded(logprobs["token_logprobs"]), logprobs["text_offset"], tops)
        choices.append(
            {
                "text": choice["text"] if "text" in choice else choice["message"]["content"],
                "reasoning": choice.get("message", {}).get("reasoning"),
                "tool_calls": [(call["function"]["name"], call["function"]["arguments"]) for call in calls],
                "token_ids": choice.get("token_ids"),
                "finish_reason": choice["finish_reason"],
                "logprobs": logprobs,
            }
        )
    return {
        "model": data["model"],
        "choices": choices,
        "usage": given(data.get("usage")),
        "prompt_text": data.get("prompt_text"),
        "system_fingerprint": data.get("system_fingerprint"),
    }


def streamed(lines: list[str]) -> dict[str, Any]:
    """A stream as compared: each choice's joined text and finish, its calls (name, joined arguments), the usage, the
    end marker."""
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    texts: dict[int, str] = {}
    calls: dict[tuple[int, int], list[str]] = {}
    reasoning: dict[int, str] = {}
    finishes: dict[int, str] = {}
    pieces: dict[int, int] = {}
    logprobs: dict[int, dict[str, list[Any]]] = {}  # completions': each field joined over the choice's chunks
    for chunk in chunks:
        for choice in chunk["choices"]:
            for field, values in (choice.get("logprobs") or {}).items():
                joined = logprobs.setdefault(choice["index"], {}).setdefault(field, [])
                joined += rounded(values) if field == "token_logprobs" else values
            delta = choice.get("delta")
            piece = choice.get("text") if delta is None else delta.get("content")
            texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
            if delta is not None and delta.get("reasoning"):
                reasoning[choice["index"]] = reasoning.get(choice["index"], "") + delta["reasoning"]
            for call in (delta or {}).get("tool_calls") or []:
                name_and_arguments = calls.setdefault((choice["index"], call["index"]), ["", ""])
                name_and_arguments[0] += call["function"].get("name") or ""
                name_and_arguments[1] += call["function"].get("arguments") or ""
            pieces[choice["index"]] = pieces.get(choice["index"], 0) + bool(piece)
            if choice.get("finish_reason"):
                finishes[choice["index"]] = choice["finish_reason"]
    usage = [given(chunk["usage"]) for chunk in chunks if chunk.get("usage")]
    # which chunks carry the system_fingerprint (each choice's last, or the usage chunk), and its value
    fingerprinted = [
        (
            bool(chunk.get("usage")),
            [choice["finish_reason"] for choice in chunk["choices"]],
            chunk["system_fingerprint"],
        )
        for chunk in chunks
        if chunk.get("system_fingerprint")
    ]
    return {
        "texts": texts,
        "reasoning": reasoning,
        "tool_calls": calls,
        "prompt_texts": [chunk["prompt_text"] for chunk in chunks if chunk.get("prompt_text")],
        "pieces": pieces,
        "finishes": finishes,
        "logprobs": logprobs,
        "usage": usage,
        "fingerprinted": fingerprinted,
        "done": lines[-1] == "data: [DONE]",
    }


def answers(url: str) -> dict[str, Any]:
    """What a server answers: the requests above (with the second key), and the key and name checks."""
    seen: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=300) as client:
        good = {"Authorization": "Bearer key-two"}
        seen["no key"] = client.get("/v1/models").status_code
        seen["wrong key"] = client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code
        seen["health without key"] = client.get("/health").status_code
        cards = client.get("/v1/models", headers=good).json()["data"]
        seen["models"] = [(card["id"], card["parent"]) for card in cards]
        seen["unknown model"] = client.post(
            "/v1/completions", headers=good, json={"model": "third", "prompt": "x", "max_tokens": 1}
        ).status_code
        too_long = client.post("/v1/completions", headers=good, json={"prompt": PROMPT, "max_tokens": 5000})
        seen["max_tokens above the context"] = (too_long.status_code, too_long.json()["error"]["param"])
        for index, (path, body) in enumerate(SAME_REQUESTS):
            body = {"model": "first", **body}
            if body.get("stream"):
                with client.stream("POST", path, headers=good, json=body) as response:
                    assert response.status_code == 200, response.read()
                    seen[f"request {index}"] = streamed([line for line in response.iter_lines() if line])
                continue
            response = client.post(path, headers=good, json={**body, "return_token_ids": True})
            assert response.status_code == 200, response.text
            seen[f"request {index}"] = summary(response.json())
        seen.update(anthropic_messages(client))
        seen.update(openai_responses(client))
        seen["official clients"] = official_clients(url)
        seen.update(runtime_adapters(client, good))
        seen["metrics"] = settled_metrics(client)
    return seen


# Anthropic's Messages API (greedy: it has no seed): a whole answer, and a stream with tools (the key as a Bearer
# token: vLLM's server does not read x-api-key)
MESSAGES = {
    "model": "first", "max_tokens": 24, "temperature": 0, "system": [{"type": "text", "text": "Be brief."}],
    "messages": [{"role": "user", "content": "Hi"}],
}  # fmt: skip
MESSAGES_TOOLS = [{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def anthropic_messages(client: httpx.Client) -> dict[str, Any]:
    """Each answer as compared: its blocks (type, text, tool name and input), stop reason and usage; a stream's
    event types in order (repeats of one kind of delta as one) and its blocks' joined deltas."""
    headers = {"Authorization": "Bearer key-one", "anthropic-version": "2023-06-01"}
    whole = client.post("/v1/messages", headers=headers, json=MESSAGES)
    assert whole.status_code == 200, whole.text
    body = whole.json()
    blocks = [
        (block["type"], unfinished(block.get("text", block.get("thinking"))), block.get("name"), block.get("input"))
        for block in body["content"]
    ]
    seen: dict[str, Any] = {
        "messages whole": (blocks, body["stop_reason"], body.get("stop_sequence"), body["usage"], body["type"])
    }
    events: list[tuple[str, str]] = []
    texts: dict[int, str] = {}
    for event in named_events(client, "/v1/messages", headers, {**MESSAGES, "tools": MESSAGES_TOOLS}):
        delta = event.get("delta", {})
        detail = event.get("content_block", {}).get("type") or delta.get("type") or ""
        if not events or events[-1] != (event["type"], detail):
            events.append((event["type"], detail))
        piece = delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
        texts[event.get("index", -1)] = texts.get(event.get("index", -1), "") + piece
        if event["type"] == "message_delta":
            seen["messages stream end"] = (delta, event["usage"])
    seen["messages streamed"] = (events, {index: unfinished(text) for index, text in texts.items()})
    return seen


# OpenAI's Responses API (greedy, not stored): a whole answer with instructions, and a stream with tools
RESPONSES = {
    "model": "first",
    "max_output_tokens": 24,
    "temperature": 0,
    "instructions": "Be brief.",
    "input": "Hi",
    "store": False,
}
RESPONSE_DEFAULTED = {"input": "Hi", "max_output_tokens": 2, "presence_penalty": 0.5, "store": False}
ECHOED_SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "max_output_tokens", "top_logprobs")
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def openai_responses(client: httpx.Client) -> dict[str, Any]:
    """Each answer as compared: its output items (type, text, name, arguments), status and usage; a stream's event
    types in order (repeats of one as one) and its items' joined deltas."""
    headers = {"Authorization": "Bearer key-one"}
    whole = client.post("/v1/responses", headers=headers, json=RESPONSES)
    assert whole.status_code == 200, whole.text
    body = whole.json()

    def item_of(item: dict[str, Any]) -> tuple[Any, ...]:
        texts = [unfinished(part.get("text")) for part in item.get("content") or []]
        return (item["type"], texts, item.get("name"), item.get("arguments"), item.get("status"))

    # the sampling fields the response echoes: the request's, else the model's generation config's (its temperature
    # and top_p), else vLLM's own (the penalties); the output itself is sampled, not compared
    sampled = client.post("/v1/responses", headers=headers, json={**RESPONSE_DEFAULTED, "model": "first"}).json()
    seen: dict[str, Any] = {
        "responses whole": (
            [item_of(item) for item in body["output"]],
            body["status"],
            body["incomplete_details"],
            body["usage"],
        ),
        "responses defaults": {name: sampled[name] for name in ECHOED_SAMPLING},
    }
    events: list[str] = []
    texts: dict[int, str] = {}
    for event in named_events(client, "/v1/responses", headers, {**RESPONSES, "tools": RESPONSES_TOOLS}):
        if not events or events[-1] != event["type"]:
            events.append(event["type"])
        if event["type"].endswith(".delta"):
            texts[event["output_index"]] = texts.get(event["output_index"], "") + event["delta"]
        if event["type"] == "response.completed":
            final = event["response"]
            seen["responses stream end"] = (
                [item_of(item) for item in final["output"]],
                final["status"],
                final["usage"],
            )
    seen["responses streamed"] = (events, {index: unfinished(text) for index, text in texts.items()})
    return seen


def official_clients(url: str) -> dict[str, Any]:
    """The texts the official `openai` (Responses) and `anthropic` (Messages) clients get, whole and streamed."""
    import anthropic
    import openai

    responses = openai.OpenAI(base_url=f"{url}/v1", api_key="key-one", max_retries=0)
    whole = responses.responses.create(**RESPONSES)
    with responses.responses.stream(**RESPONSES) as stream:
        streamed = stream.get_final_response()
    messages = anthropic.Anthropic(base_url=url, auth_token="key-one", max_retries=0)
    fields = {key: value for key, value in MESSAGES.items() if key != "temperature"}
    extra = {"temperature": MESSAGES["temperature"]}  # the SDK no longer names it; the servers take it
    answer = messages.messages.create(**fields, extra_body=extra)
    with messages.messages.stream(**fields, extra_body=extra) as stream:
        final = stream.get_final_message()

    def texts(blocks: Any) -> list[tuple[str, str | None]]:
        return [
            (block.type, unfinished(getattr(block, "text", None) or getattr(block, "thinking", None)))
            for block in blocks
        ]

    return {
        "responses": [(item.type, [unfinished(part.text) for part in item.content]) for item in whole.output],
        "responses streamed": [
            (item.type, [unfinished(part.text) for part in item.content]) for item in streamed.output
        ],
        "messages": (texts(answer.content), answer.stop_reason),
        "messages streamed": (texts(final.content), final.stop_reason),
    }


def named_events(client: httpx.Client, path: str, headers: dict[str, str], body: dict[str, Any]) -> list[Any]:
    """A streamed answer's events, each an `event: <type>` line and a `data:` line whose type is that one."""
    with client.stream("POST", path, headers=headers, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        return named_sse_events([line for line in response.iter_lines() if line])


def unfinished(text: str | None) -> str | None:
    """A text without the unfinished last character detok gives as U+FFFD (vLLM drops it: same_text)."""
    return text.removesuffix("\ufffd") if text is not None else None


# the LoRA adapter loaded at run time (VLLM_ALLOW_RUNTIME_LORA_UPDATING) is the static one's directory: the same
# seeded request (ON_ADAPTER) on either gives the same text
RUNTIME_LORA = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}


def runtime_adapters(client: httpx.Client, headers: dict[str, str]) -> dict[str, Any]:
    """/v1/load_lora_adapter and /v1/unload_lora_adapter: loads, the refusals, the adapter served and used."""
    path = str(lora_adapter())
    seen: dict[str, Any] = {}

    def call(route: str, body: dict[str, Any]) -> tuple[int, str]:
        response = client.post(route, headers=headers, json=body)
        text = response.text if response.status_code == 200 else response.json()["error"]["message"]
        return response.status_code, text

    def cards() -> list[tuple[str, str | None]]:
        return [(card["id"], card["parent"]) for card in client.get("/v1/models", headers=headers).json()["data"]]

    seen["adapter load"] = call("/v1/load_lora_adapter", {"lora_name": "runtime", "lora_path": path})
    seen["adapter load again"] = call("/v1/load_lora_adapter", {"lora_name": "runtime", "lora_path": path})[0]
    seen["adapter load in place"] = call(
        "/v1/load_lora_adapter", {"lora_name": "runtime", "lora_path": path, "load_inplace": True}
    )
    seen["adapter load as a served name"] = call("/v1/load_lora_adapter", {"lora_name": "second", "lora_path": path})
    seen["adapter load from nowhere"] = call(
        "/v1/load_lora_adapter", {"lora_name": "nowhere", "lora_path": "/nonexistent/adapter"}
    )
    seen["adapter load without a path"] = client.post(
        "/v1/load_lora_adapter", headers=headers, json={"lora_name": "x"}
    ).status_code
    seen["adapter load without a key"] = client.post(
        "/v1/load_lora_adapter", json={"lora_name": "y", "lora_path": path}
    ).status_code
    seen["models with the runtime adapter"] = cards()
    response = client.post("/v1/completions", headers=headers, json={**ON_ADAPTER, "model": "runtime"})
    assert response.status_code == 200, response.text
    seen["on the runtime adapter"] = summary(response.json())
    seen["adapter unload"] = call("/v1/unload_lora_adapter", {"lora_name": "runtime"})
    seen["adapter unload again"] = call("/v1/unload_lora_adapter", {"lora_name": "runtime"})[0]
    seen["models after the unload"] = cards()
    seen["on the unloaded adapter"] = client.post(
        "/v1/completions", headers=headers, json={**ON_ADAPTER, "model": "runtime"}
    ).status_code
    return seen


def settled_metrics(client: httpx.Client) -> dict[str, Any]:
    """The metrics once two scrapes half a second apart agree: a server records a step's stats just after it sends
    the step's text on, so the last response can reach the client first."""
    last = None
    deadline = time.monotonic() + 10
    while True:
        now = vllm_metrics(client.get("/metrics").text)
        if now == last or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(0.5)


COUNTED = ("vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success")
# vLLM's families detok does not export, each in docs/http_api.md ("Still different")
NOT_EXPORTED = frozenset({"vllm:tool_call_parser_invocations"})


def vllm_metrics(text: str) -> dict[str, Any]:
    """The `vllm:` families as compared: each one's type and label names; the counters that count the same thing
    in both servers (tokens in and out, requests by how they ended); the running and waiting gauges."""
    families = {}
    counts = {}
    gauges = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("vllm:") or family.name.endswith("_created"):
            continue  # _created: prometheus_client's creation times, absent in multiprocess mode (vLLM's too)
        labels = sorted({name for sample in family.samples for name in sample.labels if name != "le"})
        families[family.name] = (family.type, labels)
        for sample in family.samples:
            if family.name in COUNTED and sample.name.endswith("_total"):
                counts[(sample.name, sample.labels.get("finished_reason"))] = sample.value
            if family.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                gauges[family.name] = sample.value
    return {"families": families, "counts": counts, "idle gauges": gauges}


def same_text(detok: str | None, vllm: str | None) -> bool:
    """Equal, but for the one difference allowed: vLLM drops a last character its ids leave unfinished, which detok
    gives as the tokenizer's full decode does (U+FFFD)."""
    return detok == vllm or (detok is not None and vllm is not None and detok == vllm + "\ufffd")


def test_vllms_server_and_detok_on_the_same_flags_answer_alike() -> None:
    model = model_with_sampling_defaults()
    flags = shared_flags()
    with vllm_server(*flags, model=model, env=RUNTIME_LORA) as server:
        expected = answers(server.url)
    with detok_vllm(engine_flags=flags, model=model, env=RUNTIME_LORA) as service:
        got = answers(service.url)
    assert (expected["no key"], expected["wrong key"], expected["health without key"]) == (401, 401, 200)
    assert expected["models"] == [("first", None), ("second", None), ("adapter", "first")]
    on_adapter = next(index for index, (_, body) in enumerate(SAME_REQUESTS) if body.get("model") == "adapter")
    assert expected[f"request {on_adapter}"]["model"] == "adapter"
    assert expected["adapter load"] == (200, "Success: LoRA adapter 'runtime' added successfully.")
    assert expected["adapter load again"] == expected["adapter load as a served name"][0] == 400
    assert expected["adapter load from nowhere"][0] == 404 and expected["adapter load without a key"] == 401
    assert ("runtime", "first") in expected["models with the runtime adapter"]
    assert ("runtime", "first") not in expected["models after the unload"]
    streamed_events = expected["messages streamed"][0]
    assert streamed_events[0] == ("message_start", "") and streamed_events[-1] == ("message_stop", "")
    assert ("content_block_start", "thinking") in streamed_events and expected["messages whole"][0]
    assert expected["responses streamed"][0][-1] == "response.completed" and expected["responses whole"][0]
    defaulted = expected["responses defaults"]  # the model's generation config, the request's, vLLM's own
    assert (defaulted["temperature"], defaulted["top_p"], defaulted["presence_penalty"]) == (0.6, 0.95, 0.5)
    clients = expected["official clients"]
    assert clients["responses"] == clients["responses streamed"] and clients["responses"]
    assert clients["messages"] == clients["messages streamed"] and clients["messages"][0]
    runtime_text = expected["on the runtime adapter"]["choices"][0]["text"]
    assert runtime_text == expected[f"request {on_adapter}"]["choices"][0]["text"]
    assert expected["on the runtime adapter"]["model"] == "runtime"
    assert (expected["adapter unload again"], expected["on the unloaded adapter"]) == (404, 404)
    assert expected["request 0"]["usage"]["completion_tokens"] == 16
    assert expected["request 2"]["choices"][0]["finish_reason"] == "length"
    assert expected["request 2"]["usage"]["completion_tokens"] < 256
    assert expected["max_tokens above the context"] == (400, "max_tokens")
    assert len(expected["request 6"]["choices"]) == 2 and expected["request 7"]["choices"][0]["logprobs"]
    assert expected["request 8"]["prompt_text"].startswith("<|im_start|>user\nHi")  # return_prompt_text
    assert expected["request 13"]["prompt_texts"] == [expected["request 8"]["prompt_text"]]
    assert expected["request 15"]["texts"].keys() == {0, 1, 2, 3}  # the streamed batch: 2 prompts, n = 2
    assert expected["request 16"]["prompt_text"].startswith("<|im_start|>system\nBe kind.\n\nBe\nbrief.<|im_end|>")
    assert '"arguments": {"city": "Paris"}' in expected["request 17"]["prompt_text"]
    continued, thinking_off = expected["request 18"]["choices"][0], expected["request 19"]["choices"][0]
    chosen_tops = expected["request 20"]["choices"][0]["logprobs"][3]
    assert all({"Hello", "!"} <= set(top) for top in chosen_tops), chosen_tops  # ids 9707 and 0, every position
    assert continued["reasoning"] and not thinking_off["reasoning"] and thinking_off["text"]
    echoed_stream = expected["request 22"]["logprobs"][0]  # the prompt's tokens (the first without a logprob), then 4
    assert echoed_stream["token_logprobs"][0] is None and len(echoed_stream["tokens"]) > 4
    assert expected["request 5"]["choices"][0]["reasoning"]  # --reasoning-parser qwen3 split the chat's output
    assert expected["request 5"]["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    required, named = expected[f"request {len(SAME_REQUESTS) - 3}"], expected[f"request {len(SAME_REQUESTS) - 2}"]
    assert required["choices"][0]["tool_calls"] and required["choices"][0]["finish_reason"] == "tool_calls"
    assert required["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}  # thinking off
    assert list(named["tool_calls"].values())[0][0] == "weather" and named["finishes"] == {0: "stop"}
    cached_again = expected[f"request {len(SAME_REQUESTS) - 4}"]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached_again > 0 and expected["request 0"]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    for key, value in expected.items():
        if key == "metrics":
            continue
        if isinstance(value, dict) and "texts" in value:  # a stream
            mine = got[key]
            assert mine["texts"].keys() == value["texts"].keys(), key
            for index, text in value["texts"].items():
                assert same_text(mine["texts"][index], text), f"{key} choice {index}: {mine['texts'][index]!r}"
            assert (mine["finishes"], mine["usage"], mine["done"]) == (value["finishes"], value["usage"], True), key
            assert mine["fingerprinted"] == value["fingerprinted"] and value["fingerprinted"], key
            echoed = SAME_REQUESTS[int(key.split()[1])][1].get("echo")  # detok's prompt has a chunk of its own
            pieces = {index: count + 1 for index, count in value["pieces"].items()} if echoed else value["pieces"]
            # --stream-interval holds ids between sends: never more pieces than vLLM's; fewer where text that reached
            # the front together went out as one chunk (a request on the handler path, e.g. with logprobs, whose
            # handler ran late on a loaded machine: vLLM's output collector merges the same way)
            assert mine["pieces"].keys() == pieces.keys() and all(
                min(count, 1) <= mine["pieces"][index] <= count for index, count in pieces.items()
            ), f"{key}: the text came in more pieces than vLLM's (--stream-interval): {mine['pieces']} {pieces}"
            assert mine["logprobs"] == value["logprobs"], key
            assert mine["tool_calls"] == value["tool_calls"], key
            assert mine["prompt_texts"] == value["prompt_texts"], key
            assert mine["reasoning"].keys() == value["reasoning"].keys(), key
            for index, text in value["reasoning"].items():
                assert same_text(mine["reasoning"][index], text), (
                    f"{key} reasoning {index}: {mine['reasoning'][index]!r}"
                )
        elif isinstance(value, dict) and "choices" in value:
            mine = got[key]
            for theirs, ours in zip(value["choices"], mine["choices"], strict=True):
                assert same_text(ours.pop("text"), theirs.pop("text")), f"{key}: {mine}"
                assert same_text(ours.pop("reasoning"), theirs.pop("reasoning")), f"{key}: {mine}"
                assert ours == theirs, f"{key}: detok {ours!r}, vLLM {theirs!r}"
            assert (mine["model"], mine["usage"], mine["prompt_text"]) == (
                value["model"],
                value["usage"],
                value["prompt_text"],
            ), key
            assert mine["system_fingerprint"] == value["system_fingerprint"] is not None, key
        else:
            assert got[key] == value, f"{key}: detok {got[key]!r}, vLLM {value!r}"
    assert got["unknown model"] == expected["unknown model"] == 404
    metrics, theirs = got.pop("metrics"), expected["metrics"]
    missing = {
        name: kind
        for name, kind in theirs["families"].items()
        if metrics["families"].get(name) != kind and name not in NOT_EXPORTED
    }
    assert not missing, f"vLLM's families that detok lacks or types or labels differently: {missing}"
    assert metrics["counts"] == theirs["counts"] and theirs["counts"][("vllm:generation_tokens_total", None)] > 0
    assert (
        metrics["idle gauges"]
        == theirs["idle gauges"]
        == {
            "vllm:num_requests_running": 0.0,
            "vllm:num_requests_waiting": 0.0,
        }
    )


def test_disable_log_stats_then_sigterm_lets_vllms_engine_core_stop_on_its_own() -> None:
    """--disable-log-stats: no vllm: family (detok's own stay) and no stats line, however long the engine runs.
    Then `detok serve` stops as `vllm serve` does: the engine process shuts vLLM's engine core down itself (vLLM
    gives it seconds), and is not killed after the supervisor's usual few seconds. (One service for both: a vLLM
    start is the suite's dearest step.)"""
    with detok_vllm(engine_flags=("--disable-log-stats",), env=LOG_EVERY_SECOND) as service:
        with httpx.Client(base_url=service.url, timeout=120) as client:
            body = {"model": SERVED_NAME, "prompt": "Hi", "max_tokens": 64, "temperature": 1.0, "seed": 1}
            response = client.post("/v1/completions", json=body)
            assert response.status_code == 200
            assert response.json()["usage"]["completion_tokens"] > 0
            time.sleep(3)  # three periods of the stats line
            wait_for(lambda: "detok_front_tokens_total" in client.get("/metrics").text, 10, what="detok's families")
            assert "vllm:" not in client.get("/metrics").text
        assert STATS_LINE not in service.log(None)
        engine = service.child_pids("engine")
        assert len(engine) == 1
        cores = list(children_of(engine[0]))  # vLLM's EngineCore process
        assert cores
        code = service.stop(timeout=120)
        log = service.log(None)
    assert code == 0, log[-3000:]
    assert "did not exit in time" not in log
    assert not [pid for pid in [*engine, *cores] if pid_alive(pid)]
