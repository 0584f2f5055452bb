"""A request's SamplingParams (bus) as the token-only gRPC API's SamplingParams, per dialect (vLLM's
`VllmEngine`, SGLang's `SglangScheduler`). A value a dialect has no field for, or that does not fit its field,
raises UnsupportedParameter naming the request parameter: the gateway then rejects the request with it and the
front answers 400 (a parameter is honoured or refused, never dropped).

Unset values stay unset, so the engine applies its own defaults (proto3 scalars: 0 = unset for top_p, top_k,
min_p and the penalties; the front refuses the values of those that would read as unset, e.g. top_p 0).
"""

from __future__ import annotations

import json
import re
from typing import Any

from detok_worker.bus.messages import (
    CONSTRAINT_CHOICE,
    CONSTRAINT_GRAMMAR,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_REGEX,
    CONSTRAINT_STRUCTURAL_TAG,
    Constraint,
    RequestParams,
    SamplingParams,
)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_FLOATS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


class UnsupportedParameter(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _common_fields(sampling: SamplingParams) -> dict[str, Any]:
    """The fields both dialects' SamplingParams have."""
    fields: dict[str, Any] = {name: getattr(sampling, name) for name in _FLOATS if getattr(sampling, name) is not None}
    if sampling.top_k is not None and sampling.top_k > 0:
        fields["top_k"] = _int32(sampling.top_k, "top_k")
    fields["n"] = sampling.n
    return fields


def vllm_sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for VllmEngine's SamplingParams."""
    fields = _common_fields(sampling)
    if sampling.seed is not None:
        fields["seed"] = _int32(sampling.seed, "seed")
    if sampling.logprobs is not None:
        fields["logprobs"] = sampling.logprobs
    fields["logit_bias"] = dict(sampling.logit_bias)
    fields.update(_vllm_constraint(sampling.constraint))
    return fields


def sglang_sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for SglangScheduler's SamplingParams (no seed; logprobs go in the request:
    sglang_request_fields)."""
    if sampling.seed is not None:
        raise UnsupportedParameter("seed", "SGLang's gRPC SamplingParams has no seed")
    fields = _common_fields(sampling)
    fields["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    fields.update(_sglang_constraint(sampling.constraint))
    return fields


def refuse_engine_fields(params: RequestParams) -> None:
    """vLLM's engine-core fields have no place in the token-only gRPC API: a request that sets one is refused naming
    it (the front refuses them first for this source; this holds for any front that speaks the bus)."""
    sampling = params.sampling
    asked = (
        ("allowed_token_ids", sampling.allowed_token_ids is not None),
        ("bad_words", bool(sampling.bad_words)),
        ("priority", params.priority != 0),
        ("cache_salt", params.cache_salt is not None),
        ("logprob_token_ids", bool(sampling.logprob_token_ids)),
        ("prompt_logprobs", sampling.prompt_logprobs is not None),
        ("thinking_token_budget", sampling.thinking_token_budget is not None),
        ("vllm_xargs", bool(sampling.extra_args)),
        ("stream_interval", sampling.stream_interval is not None),
        ("session_id", params.session_id is not None),
        ("model", bool(params.lora)),  # a LoRA adapter, named as the request's model
    )
    for param, set_ in asked:
        if set_:
            raise UnsupportedParameter(param, f"{param} cannot be passed to a gRPC engine (use --source vllm)")


def sglang_request_fields(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for SglangScheduler's GenerateRequest itself: SGLang asks for logprobs there."""
    if sampling.logprobs is not None:
        return {"return_logprob": True, "top_logprobs_num": sampling.logprobs}
    return {}


def _int32(value: int, param: str) -> int:
    if not INT32_MIN <= value <= INT32_MAX:
        raise UnsupportedParameter(param, f"{param} must fit in 32 bits for the gRPC engine (got {value})")
    return value


def _vllm_constraint(constraint: Constraint | None) -> dict[str, Any]:
    if constraint is None:
        return {}
    kind = constraint.kind
    if kind == CONSTRAINT_JSON_OBJECT:
        return {"json_object": True}
    if kind == CONSTRAINT_CHOICE:
        return {"choice": {"choices": list(constraint.choices)}}
    if kind in (CONSTRAINT_JSON_SCHEMA, CONSTRAINT_REGEX, CONSTRAINT_GRAMMAR, CONSTRAINT_STRUCTURAL_TAG):
        return {kind: constraint.spec}
    raise UnsupportedParameter("response_format", f"unknown constraint kind {kind!r}")


def _sglang_constraint(constraint: Constraint | None) -> dict[str, Any]:
    """SGLang has regex, json_schema, ebnf_grammar and structural_tag: a JSON object is the schema of any object
    and a choice the regex of its alternatives (as SGLang's own OpenAI server does)."""
    if constraint is None:
        return {}
    kind = constraint.kind
    if kind == CONSTRAINT_JSON_OBJECT:
        return {"json_schema": json.dumps({"type": "object"})}
    if kind == CONSTRAINT_CHOICE:
        return {"regex": "(" + "|".join(re.escape(choice) for choice in constraint.choices) + ")"}
    if kind == CONSTRAINT_GRAMMAR:
        return {"ebnf_grammar": constraint.spec}
    if kind in (CONSTRAINT_JSON_SCHEMA, CONSTRAINT_REGEX, CONSTRAINT_STRUCTURAL_TAG):
        return {kind: constraint.spec}
    raise UnsupportedParameter("response_format", f"unknown constraint kind {kind!r}")
