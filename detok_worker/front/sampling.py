"""The engine's side of a request: sampling parameters and structured-output constraints, checked and turned into
the bus SamplingParams (bus/messages.py) the engine receives. detok never samples; it forwards what the client
asked for so the engine can honour it, and refuses (400 naming the field) what it cannot forward.

Constraint sources, as vLLM reads them: `response_format` (json_object, json_schema, structural_tag),
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, `structural_tag`, `structured_outputs`
(vLLM >= 0.10: json, regex, choice, grammar, json_object, structural_tag), and a chat `tool_choice` of
"required" or a named function (a JSON schema over the request's tools, built as vLLM builds it; or, with
front.tool_choice_grammar = "tool_parser", the request's tools for the engine to build the tool-call parser's own
grammar from, for "auto" too when nothing else constrains the output). At most one.

Each field's own check is its row in bus/request_fields.py; here are the checks that need the vocabulary or the
whole request (logit_bias, logprobs, allowed_token_ids, prompt_logprobs, logprob_token_ids), as vLLM's server makes
them; validation.py refuses what the engine source cannot pass on.
"""

from __future__ import annotations

import json
import math
from typing import Any

from detok_worker.bus.messages import (
    CONSTRAINT_CHOICE,
    CONSTRAINT_GRAMMAR,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_REGEX,
    CONSTRAINT_STRUCTURAL_TAG,
    CONSTRAINT_TOOL_CALLS,
    MAX_TOP_LOGPROBS,
    Constraint,
    SamplingParams,
)
from detok_worker.bus.request_fields import SAMPLING_CHECKED, RequestField
from detok_worker.errors import ParameterError
from detok_worker.front.errors import bad_request
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest, GenerationRequest
from detok_worker.tokenizer.protocol import is_count

LOGIT_BIAS_LIMIT = 100.0
# structured_outputs keys that select the constraint -> its kind; the others are backend options detok cannot pass
_STRUCTURED_KINDS = {
    "json": CONSTRAINT_JSON_SCHEMA,
    "regex": CONSTRAINT_REGEX,
    "choice": CONSTRAINT_CHOICE,
    "grammar": CONSTRAINT_GRAMMAR,
    "json_object": CONSTRAINT_JSON_OBJECT,
    "structural_tag": CONSTRAINT_STRUCTURAL_TAG,
}
_STRUCTURED_OPTIONS = frozenset(
    {"disable_fallback", "disable_any_whitespace", "disable_additional_properties", "whitespace_pattern"}
)


def sampling_params(
    request: CompletionRequest | ChatCompletionRequest,
    vocab_size: int,
    scores_prompts: bool = False,
    tool_parser_grammar: bool = False,
) -> SamplingParams:
    """The request's SamplingParams (n=1: validation.py refuses the others): each field of the table
    (bus/request_fields.py) checked there, then those whose check needs the vocabulary or the whole request.
    `scores_prompts`: the engine source computes prompt logprobs (see prompt_logprobs_of). `tool_parser_grammar`:
    the engine builds the tool-call grammar (front.tool_choice_grammar)."""
    return SamplingParams(
        **checked_values(request, SAMPLING_CHECKED),
        logit_bias=_logit_bias(request.logit_bias, vocab_size),
        logprobs=logprobs_of(request),
        constraint=constraint_of(request, tool_parser_grammar),
        allowed_token_ids=_allowed_token_ids(request.allowed_token_ids, vocab_size),
        prompt_logprobs=prompt_logprobs_of(request, scores_prompts),
        logprob_token_ids=_logprob_token_ids(request, vocab_size),
    )


def checked_values(request: GenerationRequest, fields: tuple[RequestField, ...]) -> dict[str, Any]:
    """bus name -> value of the `fields` the request sets, each through its table check (a 400 naming it)."""
    values: dict[str, Any] = {}
    for field in fields:
        value = getattr(request, field.client_name, None)
        if value is None:
            continue
        if field.check is not None:
            try:
                value = field.check(value)
            except ParameterError as exc:
                raise bad_request(str(exc), exc.param) from exc
        if value is not None:
            values[field.name] = value
    return values


def _logprob_token_ids(request: CompletionRequest | ChatCompletionRequest, vocab_size: int) -> list[int] | None:
    """vLLM's rules: only with `logprobs` set, and never with nothing generated (echo with max_tokens 0)."""
    ids = request.logprob_token_ids if isinstance(request, CompletionRequest) else None
    if not ids:
        return None
    if request.logprobs is None:
        raise bad_request("when using `logprob_token_ids`, `logprobs` must be set.", "logprob_token_ids")
    if request.echo and request.max_tokens == 0:
        message = "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0`"
        raise bad_request(message, "logprob_token_ids")
    return _allowed_token_ids(ids, vocab_size, "logprob_token_ids")


def logprobs_of(request: CompletionRequest | ChatCompletionRequest) -> int | None:
    """How many top candidates per output token the client wants (None: no logprobs). Completions: `logprobs` is
    that number; chat: `logprobs: true` with `top_logprobs` (default 0), which needs logprobs true (as vLLM)."""
    if isinstance(request, CompletionRequest):
        top, name = request.logprobs, "logprobs"
        if top is None:
            return None
    else:
        if request.logprobs not in (None, True, False):
            raise bad_request("logprobs must be true or false", "logprobs")
        top, name = request.top_logprobs, "top_logprobs"
        if not request.logprobs:
            if top not in (None, 0):
                raise bad_request("top_logprobs needs logprobs set to true", "top_logprobs")
            return None
        top = 0 if top is None else top
    if not is_count(top) or top > MAX_TOP_LOGPROBS:
        raise bad_request(f"{name} must be an integer from 0 to {MAX_TOP_LOGPROBS} (got {top!r})", name)
    return top


def prompt_logprobs_of(request: CompletionRequest | ChatCompletionRequest, scores_prompts: bool = False) -> int | None:
    """vLLM's prompt_logprobs as its server checks it: k >= 0 or -1 (the whole vocabulary); above the engine's
    --max-logprobs vLLM's own check refuses it. A stream cannot carry them (vLLM: a 400 for k > 0 or -1, and 0 is
    accepted and shows nothing, so it is not asked of the engine). Completions' echo with max_tokens 0 is answered
    without the engine here, so it cannot have them. A completion with echo and logprobs (whole or streamed) asks
    for the prompt's `logprobs` top candidates when none are asked and the engine computes them (`scores_prompts`),
    as vLLM does: its `logprobs` then start with the prompt's tokens (echo_logprobs)."""
    k = request.prompt_logprobs
    if k is None:
        echoed = isinstance(request, CompletionRequest) and request.echo and request.logprobs is not None
        if echoed and scores_prompts and request.max_tokens != 0:
            return request.logprobs
        return None
    if k < 0 and k != -1:
        raise bad_request(f"prompt_logprobs must be a positive value or -1 (got {k})", "prompt_logprobs")
    if request.stream:
        if k != 0:
            raise bad_request("prompt_logprobs are not available when stream=True", "prompt_logprobs")
        return None
    if isinstance(request, CompletionRequest) and request.echo and request.max_tokens == 0:
        message = "prompt_logprobs with echo and max_tokens 0 is not supported (the answer is made without the engine)"
        raise bad_request(message, "prompt_logprobs", code="unsupported_parameter")
    return k


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    """OpenAI's form: token ids as strings -> bias; a bias outside -100..100 is clamped into it, as vLLM's
    SamplingParams does (OpenAI refuses it)."""
    result: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not (key.isascii() and key.isdigit()) or int(key) >= vocab_size:
            message = f"logit_bias: {key!r} is not a token id of this model (0..{vocab_size - 1})"
            raise bad_request(message, "logit_bias")
        if not math.isfinite(value):
            raise bad_request(f"logit_bias values must be finite (got {value})", "logit_bias")
        result[int(key)] = min(LOGIT_BIAS_LIMIT, max(-LOGIT_BIAS_LIMIT, float(value)))
    return result


def _allowed_token_ids(ids: list[int] | None, vocab_size: int, param: str = "allowed_token_ids") -> list[int] | None:
    """vLLM: a non-empty list of ids inside the vocabulary (None: no restriction); `param`: the field named."""
    if ids is None:
        return None
    if not ids:
        raise bad_request(f"{param} must not be empty", param)
    outside = [token_id for token_id in ids if not 0 <= token_id < vocab_size]
    if outside:
        message = f"{param}: {outside[:5]} are not token ids of this model (0..{vocab_size - 1})"
        raise bad_request(message, param)
    return list(ids)


# ---- constraints --------------------------------------------------------------------------------------------


def constraint_of(
    request: CompletionRequest | ChatCompletionRequest, tool_parser_grammar: bool = False
) -> Constraint | None:
    """The one structured-output constraint the request asks for, or None; two sources are a 400."""
    found: list[tuple[str, Constraint]] = []
    if request.response_format is not None:
        found += [("response_format", c) for c in [_from_response_format(request.response_format)] if c]
    guided = (
        ("guided_json", request.guided_json, CONSTRAINT_JSON_SCHEMA),
        ("guided_regex", request.guided_regex, CONSTRAINT_REGEX),
        ("guided_choice", request.guided_choice, CONSTRAINT_CHOICE),
        ("guided_grammar", request.guided_grammar, CONSTRAINT_GRAMMAR),
        ("structural_tag", request.structural_tag, CONSTRAINT_STRUCTURAL_TAG),
    )
    found += [(name, _constraint(kind, value, name)) for name, value, kind in guided if value is not None]
    if request.structured_outputs is not None:
        found += [("structured_outputs", c) for c in [_from_structured_outputs(request.structured_outputs)] if c]
    if isinstance(request, ChatCompletionRequest):
        tools = tool_choice_constraint(request, tool_parser_grammar)
        # "auto" asks for no grammar of its own: another constraint wins (vLLM keeps it too)
        if tools is not None and not (found and request.tool_choice in (None, "auto")):
            found.append(("tool_choice", tools))
    if len(found) > 1:
        first, second = found[0][0], found[1][0]
        raise bad_request(f"{second}: a request takes one structured-output constraint (also got {first})", second)
    return found[0][1] if found else None


def _constraint(kind: str, value: Any, param: str) -> Constraint:
    if kind == CONSTRAINT_JSON_OBJECT:
        return Constraint(kind)
    if kind == CONSTRAINT_CHOICE:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise bad_request(f"{param} must be a non-empty list of strings", param)
        return Constraint(kind, choices=list(value))
    if kind in (CONSTRAINT_JSON_SCHEMA, CONSTRAINT_STRUCTURAL_TAG):
        return Constraint(kind, _json_text(value, param))
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param} must be a non-empty string", param)
    return Constraint(kind, value)


def _json_text(value: Any, param: str) -> str:
    """A JSON document given as an object or as JSON text -> compact JSON text (the engines take a string)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise bad_request(f"{param} is not valid JSON: {exc}", param) from exc
    if not isinstance(value, (dict, bool)):
        raise bad_request(f"{param} must be a JSON object", param)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _from_response_format(response_format: dict[str, Any]) -> Constraint | None:
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(CONSTRAINT_JSON_OBJECT)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema", spec.get("json_schema")) if isinstance(spec, dict) else None
        if schema is None:
            raise bad_request("response_format json_schema needs json_schema.schema", "response_format")
        return _constraint(CONSTRAINT_JSON_SCHEMA, schema, "response_format")
    if kind == "structural_tag":  # vLLM: the whole object is the tag
        return _constraint(CONSTRAINT_STRUCTURAL_TAG, response_format, "response_format")
    raise bad_request(
        f"response_format.type must be text, json_object, json_schema or structural_tag (got {kind!r})",
        "response_format",
    )


def _from_structured_outputs(options: dict[str, Any]) -> Constraint | None:
    for key, value in options.items():
        if key in _STRUCTURED_OPTIONS:
            if value not in (None, False, ""):
                raise bad_request(f"structured_outputs.{key} cannot be passed to the engine", "structured_outputs")
        elif key not in _STRUCTURED_KINDS:
            raise bad_request(f"structured_outputs has no field {key!r}", "structured_outputs")
    chosen = [(key, value) for key, value in options.items() if key in _STRUCTURED_KINDS and value not in (None, False)]
    if len(chosen) > 1:
        raise bad_request("structured_outputs takes one of json, regex, choice, grammar, ...", "structured_outputs")
    if not chosen:
        return None
    key, value = chosen[0]
    return _constraint(_STRUCTURED_KINDS[key], value, "structured_outputs")


def tool_choice_constraint(request: ChatCompletionRequest, tool_parser_grammar: bool = False) -> Constraint | None:
    """tool_choice "required" or a named function: the output must be tool call JSON (vLLM's schemas: for
    "required" a non-empty array of {"name", "parameters"} over the request's tools; for a named function its
    parameters). "none", "auto" and null need no constraint. With `tool_parser_grammar` the engine builds the
    grammar from the request's tools (CONSTRAINT_TOOL_CALLS), for "auto" as well."""
    choice = request.tool_choice
    if choice == "none" or (choice in (None, "auto") and not (tool_parser_grammar and request.tools)):
        return None
    tools = _function_tools(request.tools)
    if choice in (None, "auto"):
        return _tool_calls(request)
    if choice == "required":
        if not tools:
            raise bad_request('tool_choice "required" needs tools', "tool_choice")
        if tool_parser_grammar:
            return _tool_calls(request)
        variants = [
            {
                "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
                "required": ["name", "parameters"],
            }
            for name, parameters in tools.items()
        ]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
        if request.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return _constraint(CONSTRAINT_JSON_SCHEMA, schema, "tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in tools:
            raise bad_request(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
        if tool_parser_grammar:
            return _tool_calls(request)
        return _constraint(CONSTRAINT_JSON_SCHEMA, tools[name], "tool_choice")
    raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", ...}', "tool_choice")


def _tool_calls(request: ChatCompletionRequest) -> Constraint:
    """What the engine builds the tool-call grammar from: the tools, the tool_choice, parallel_tool_calls."""
    spec = {
        "tools": request.tools,
        "tool_choice": request.tool_choice,
        "parallel_tool_calls": request.parallel_tool_calls,
    }
    return Constraint(CONSTRAINT_TOOL_CALLS, json.dumps(spec, ensure_ascii=False, separators=(",", ":")))


def _function_tools(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """name -> parameters schema of the request's function tools."""
    found: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        function = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request("every tool must be {'type': 'function', 'function': {'name': ...}}", "tools")
        parameters = function.get("parameters")
        found[function["name"]] = parameters if isinstance(parameters, dict) else {"type": "object"}
    return found
