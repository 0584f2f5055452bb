"""A request's SamplingParams (bus) as the token-only gRPC API's SamplingParams, per dialect (vLLM's
`VllmEngine`, SGLang's `SglangScheduler`). A value a dialect has no field for, or that does not fit its field,
raises ParameterError naming the request parameter: the gateway then rejects the request with it and the
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
from detok_worker.bus.request_fields import GRPC_FLOATS, GRPC_REFUSED
from detok_worker.errors import ParameterError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _common_fields(sampling: SamplingParams) -> dict[str, Any]:
    """The fields both dialects' SamplingParams have."""
    fields = {name: value for name in GRPC_FLOATS if (value := getattr(sampling, name)) is not None}
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
        raise ParameterError("SGLang's gRPC SamplingParams has no seed", "seed")
    fields = _common_fields(sampling)
    fields["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    fields.update(_sglang_constraint(sampling.constraint))
    return fields


def refuse_engine_fields(params: RequestParams) -> None:
    """The fields the token-only gRPC API has no place for (bus/request_fields.py: GRPC_REFUSED), and a LoRA
    adapter: a request that sets one is refused naming it (the front refuses them first for this source; this holds
    for any front that speaks the bus)."""
    asked = [field.client_name for field in GRPC_REFUSED if field.asks(field.value_of(params))]
    if params.lora:  # a LoRA adapter, named as the request's model
        asked.append("model")
    if asked:
        raise ParameterError(f"{asked[0]} cannot be passed to a gRPC engine (use --source vllm)", asked[0])


def sglang_request_fields(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for SglangScheduler's GenerateRequest itself: SGLang asks for logprobs there."""
    if sampling.logprobs is not None:
        return {"return_logprob": True, "top_logprobs_num": sampling.logprobs}
    return {}


def _int32(value: int, param: str) -> int:
    if not INT32_MIN <= value <= INT32_MAX:
        raise ParameterError(f"{param} must fit in 32 bits for the gRPC engine (got {value})", param)
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
    raise ParameterError(f"unknown constraint kind {kind!r}", "response_format")


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
    raise ParameterError(f"unknown constraint kind {kind!r}", "response_format")
