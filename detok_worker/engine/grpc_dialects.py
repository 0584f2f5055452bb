"""The two services of the token-only gRPC engine API (SMG's protocol, PyPI `smg-grpc-proto`), one `Dialect` each:
`VllmEngine` (`vllm serve --grpc`) and `SglangScheduler` (`sglang serve --grpc-mode`). Same shape; they differ in
the limit fields (max_tokens/min_tokens vs max_new_tokens/min_new_tokens), in what their SamplingParams carry and in
Abort (a list of request ids vs one).

A request's SamplingParams (bus) map onto the service's. A value a dialect has no field for, or that does not fit its
field, raises ParameterError naming the request parameter: the gateway then rejects the request with it and the
front answers 400 (a parameter is honoured or refused, never dropped). Unset values stay unset, so the engine
applies its own defaults (proto3 scalars: 0 = unset for top_p, top_k, min_p and the penalties; the front refuses the
values of those that would read as unset, e.g. top_p 0).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc
from smg_grpc_proto import sglang_scheduler_pb2, sglang_scheduler_pb2_grpc, vllm_engine_pb2, vllm_engine_pb2_grpc

from detok_worker.bus import messages as bus
from detok_worker.bus.messages import Constraint, DetokParams, RequestParams, SamplingParams
from detok_worker.bus.request_fields import GRPC_FLOATS, GRPC_REFUSED
from detok_worker.config.schema import EngineService
from detok_worker.errors import ParameterError

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# a constraint kind -> the service's SamplingParams fields for it
Constraints = Mapping[str, Callable[[Constraint], dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Dialect:
    """What the gateway asks of a service: its messages (`pb2`, generated protobuf code), a stub on a channel, a
    GenerateRequest and an AbortRequest."""

    name: EngineService  # its engine.engine_service value
    service: str  # the gRPC service name
    pb2: ModuleType
    stub_class: Callable[[grpc.aio.Channel], Any]  # generated code: its RPCs are untyped
    limit_fields: tuple[str, str]  # its names of max_tokens and min_tokens
    sampling_fields: Callable[[SamplingParams], dict[str, Any]]
    constraints: Constraints
    # fields of the GenerateRequest itself beyond the prompt and the sampling parameters
    request_fields: Callable[[SamplingParams], dict[str, Any]]
    abort_request: Callable[[str], Any]

    def stub(self, channel: grpc.aio.Channel) -> Any:
        return self.stub_class(channel)

    def generate_request(self, rid: str, prompt_ids: list[int], params: RequestParams, detok: DetokParams) -> Any:
        """Prompt ids in, ids out: stop *strings* stay with detok's workers; stop ids (EOS included as detok
        applies it: unless ignore_eos) go to the engine so it stops generating there; the sampling parameters and
        the constraint go as the client gave them (ParameterError when they cannot)."""
        pb2 = self.pb2
        refuse_engine_fields(params)
        max_name, min_name = self.limit_fields
        sampling = pb2.SamplingParams(
            stop_token_ids=detok.stop_token_ids,
            ignore_eos=params.ignore_eos,
            skip_special_tokens=False,
            **{max_name: params.max_tokens, min_name: detok.min_tokens},
            **self.sampling_fields(params.sampling),
            **self._constraint_fields(params.sampling.constraint),
        )
        return pb2.GenerateRequest(
            request_id=rid,
            tokenized=pb2.TokenizedInput(input_ids=prompt_ids),
            sampling_params=sampling,
            stream=True,
            **self.request_fields(params.sampling),
        )

    def _constraint_fields(self, constraint: Constraint | None) -> dict[str, Any]:
        if constraint is None:
            return {}
        fields = self.constraints.get(constraint.kind)
        if fields is None:
            raise ParameterError(f"unknown constraint kind {constraint.kind!r}", "response_format")
        return fields(constraint)


def refuse_engine_fields(params: RequestParams) -> None:
    """The fields the token-only gRPC API has no place for (`GRPC_REFUSED`), and a LoRA adapter: a request that sets
    one is refused naming it (the front refuses them first for this source; this holds for any front that speaks the
    bus)."""
    asked = [field.client_name for field in GRPC_REFUSED if field.asks(field.value_of(params))]
    if params.lora:  # a LoRA adapter, named as the request's model
        asked.append("model")
    if asked:
        raise ParameterError(f"{asked[0]} cannot be passed to a gRPC engine (use --source vllm)", asked[0])


def _common_fields(sampling: SamplingParams) -> dict[str, Any]:
    """The fields both dialects' SamplingParams have."""
    fields = {name: value for name in GRPC_FLOATS if (value := getattr(sampling, name)) is not None}
    if sampling.top_k is not None and sampling.top_k > 0:
        fields["top_k"] = _int32(sampling.top_k, "top_k")
    fields["n"] = sampling.n
    return fields


def _int32(value: int, param: str) -> int:
    if not INT32_MIN <= value <= INT32_MAX:
        raise ParameterError(f"{param} must fit in 32 bits for the gRPC engine (got {value})", param)
    return value


def _vllm_sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    fields = _common_fields(sampling)
    if sampling.seed is not None:
        fields["seed"] = _int32(sampling.seed, "seed")
    if sampling.logprobs is not None:
        fields["logprobs"] = sampling.logprobs
    fields["logit_bias"] = dict(sampling.logit_bias)
    return fields


def _sglang_sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """No seed; logprobs go in the request (`_sglang_request_fields`)."""
    if sampling.seed is not None:
        raise ParameterError("SGLang's gRPC SamplingParams has no seed", "seed")
    fields = _common_fields(sampling)
    fields["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    return fields


def _spec_as(name: str) -> Callable[[Constraint], dict[str, Any]]:
    return lambda constraint: {name: constraint.spec}


_VLLM_CONSTRAINTS: Constraints = {
    bus.CONSTRAINT_JSON_OBJECT: lambda _constraint: {"json_object": True},
    bus.CONSTRAINT_CHOICE: lambda constraint: {"choice": {"choices": list(constraint.choices)}},
    **{kind: _spec_as(kind) for kind in (bus.CONSTRAINT_JSON_SCHEMA, bus.CONSTRAINT_REGEX, bus.CONSTRAINT_GRAMMAR)},
    bus.CONSTRAINT_STRUCTURAL_TAG: _spec_as(bus.CONSTRAINT_STRUCTURAL_TAG),
}
# SGLang has regex, json_schema, ebnf_grammar and structural_tag: a JSON object is the schema of any object and a
# choice the regex of its alternatives (as SGLang's own OpenAI server does)
_SGLANG_CONSTRAINTS: Constraints = {
    **_VLLM_CONSTRAINTS,
    bus.CONSTRAINT_JSON_OBJECT: lambda _constraint: {"json_schema": json.dumps({"type": "object"})},
    bus.CONSTRAINT_CHOICE: lambda constraint: {"regex": "(" + "|".join(map(re.escape, constraint.choices)) + ")"},
    bus.CONSTRAINT_GRAMMAR: _spec_as("ebnf_grammar"),
}


def _sglang_request_fields(sampling: SamplingParams) -> dict[str, Any]:
    """SGLang asks for logprobs in the GenerateRequest itself."""
    if sampling.logprobs is not None:
        return {"return_logprob": True, "top_logprobs_num": sampling.logprobs}
    return {}


DIALECTS: dict[str, Dialect] = {
    "vllm": Dialect(
        "vllm",
        "VllmEngine",
        vllm_engine_pb2,
        vllm_engine_pb2_grpc.VllmEngineStub,
        ("max_tokens", "min_tokens"),
        _vllm_sampling_fields,
        _VLLM_CONSTRAINTS,
        lambda _sampling: {},
        lambda rid: vllm_engine_pb2.AbortRequest(request_ids=[rid]),
    ),
    "sglang": Dialect(
        "sglang",
        "SglangScheduler",
        sglang_scheduler_pb2,
        sglang_scheduler_pb2_grpc.SglangSchedulerStub,
        ("max_new_tokens", "min_new_tokens"),
        _sglang_sampling_fields,
        _SGLANG_CONSTRAINTS,
        _sglang_request_fields,
        lambda rid: sglang_scheduler_pb2.AbortRequest(request_id=rid, reason="detok: stopped"),
    ),
}
AUTO_ORDER = ("vllm", "sglang")  # engine.engine_service = "auto": the services asked, in this order
