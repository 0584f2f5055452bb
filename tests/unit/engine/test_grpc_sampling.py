"""The gRPC gateway's GenerateRequest carries the request's sampling parameters and constraint in each dialect's
own SamplingParams fields (smg-grpc-proto), and refuses by name what a dialect has no field for."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict

from detok_worker.bus.messages import Constraint, DetokParams, RequestParams, SamplingParams, TokenLogprob
from detok_worker.engine.grpc_api import output_logprobs
from detok_worker.engine.grpc_dialects import DIALECTS
from detok_worker.errors import ParameterError

SAMPLING = SamplingParams(
    temperature=0.25,
    top_p=0.5,
    top_k=20,
    min_p=0.125,
    presence_penalty=-0.5,
    frequency_penalty=0.75,
    repetition_penalty=1.5,
    logit_bias={13: 5.0, 7: -100.0},
)
SCHEMA = '{"type":"object"}'


def generate(dialect: str, sampling: SamplingParams) -> Any:
    params = RequestParams(9, DetokParams(stop_token_ids=[151645], min_tokens=2), sampling=sampling)
    return DIALECTS[dialect].generate_request("rid-1", [1, 2, 3], params, params.detok)


def fields(message: Any) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_sampling_fields_reach_the_request(dialect: str) -> None:
    sampling = fields(generate(dialect, SAMPLING).sampling_params)
    expected = {
        "temperature": 0.25,
        "top_p": 0.5,
        "top_k": 20,
        "min_p": 0.125,
        "presence_penalty": -0.5,
        "frequency_penalty": 0.75,
        "repetition_penalty": 1.5,
        "n": 1,
        "stop_token_ids": [151645],
    }
    assert {name: sampling[name] for name in expected} == expected
    assert {str(k): v for k, v in sampling["logit_bias"].items()} == {"13": 5.0, "7": -100.0}
    limits = ("max_tokens", "min_tokens") if dialect == "vllm" else ("max_new_tokens", "min_new_tokens")
    assert (sampling[limits[0]], sampling[limits[1]]) == (9, 2)


def test_unset_values_stay_unset() -> None:
    sampling = generate("vllm", SamplingParams(top_k=-1)).sampling_params
    assert not sampling.HasField("temperature") and not sampling.HasField("seed") and not sampling.HasField("logprobs")
    assert (sampling.top_p, sampling.top_k, sampling.WhichOneof("constraint")) == (0.0, 0, None)


@pytest.mark.parametrize(
    ("constraint", "vllm", "sglang"),
    [
        (Constraint("json_schema", SCHEMA), {"json_schema": SCHEMA}, {"json_schema": SCHEMA}),
        (Constraint("json_object"), {"json_object": True}, {"json_schema": json.dumps({"type": "object"})}),
        (Constraint("regex", "[a-z]+"), {"regex": "[a-z]+"}, {"regex": "[a-z]+"}),
        (Constraint("grammar", 'root ::= "a"'), {"grammar": 'root ::= "a"'}, {"ebnf_grammar": 'root ::= "a"'}),
        (
            Constraint("choice", choices=["yes", "a.b"]),
            {"choice": {"choices": ["yes", "a.b"]}},
            {"regex": r"(yes|a\.b)"},
        ),
        (Constraint("structural_tag", '{"x":1}'), {"structural_tag": '{"x":1}'}, {"structural_tag": '{"x":1}'}),
    ],
)
def test_constraints_per_dialect(constraint: Constraint, vllm: dict[str, Any], sglang: dict[str, Any]) -> None:
    for dialect, expected in (("vllm", vllm), ("sglang", sglang)):
        message = generate(dialect, SamplingParams(constraint=constraint)).sampling_params
        kind = message.WhichOneof("constraint")
        assert {kind: fields(message)[kind]} == expected


def test_seed_and_logprobs() -> None:
    request = generate("vllm", SamplingParams(seed=1234, logprobs=3))
    assert (request.sampling_params.seed, request.sampling_params.logprobs) == (1234, 3)
    request = generate("sglang", SamplingParams(logprobs=3))
    assert (request.return_logprob, request.top_logprobs_num) == (True, 3)


@pytest.mark.parametrize(
    ("dialect", "sampling", "param"),
    [
        ("vllm", SamplingParams(seed=2**40), "seed"),
        ("vllm", SamplingParams(top_k=2**40), "top_k"),
        ("sglang", SamplingParams(seed=1), "seed"),
    ],
)
def test_what_a_dialect_cannot_carry_is_refused_by_name(dialect: str, sampling: SamplingParams, param: str) -> None:
    with pytest.raises(ParameterError) as raised:
        generate(dialect, sampling)
    assert raised.value.param == param


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
@pytest.mark.parametrize(
    ("params", "param"),
    [
        (RequestParams(9, sampling=SamplingParams(allowed_token_ids=[1])), "allowed_token_ids"),
        (RequestParams(9, sampling=SamplingParams(bad_words=["x"])), "bad_words"),
        (RequestParams(9, priority=3), "priority"),
        (RequestParams(9, cache_salt="s"), "cache_salt"),
        (RequestParams(9, sampling=SamplingParams(logprobs=1, logprob_token_ids=[2])), "logprob_token_ids"),
        (RequestParams(9, sampling=SamplingParams(prompt_logprobs=1)), "prompt_logprobs"),
        (RequestParams(9, sampling=SamplingParams(thinking_token_budget=8)), "thinking_token_budget"),
        (RequestParams(9, sampling=SamplingParams(extra_args={"k": 1})), "vllm_xargs"),
        (RequestParams(9, sampling=SamplingParams(stream_interval=3)), "stream_interval"),
        (RequestParams(9, session_id="c"), "session_id"),
        (RequestParams(9, lora="adapter"), "model"),
    ],
)
def test_vllm_engine_core_fields_are_refused_by_name(dialect: str, params: RequestParams, param: str) -> None:
    """They have no place in the token-only gRPC API: never dropped (the front refuses them first for this source)."""
    with pytest.raises(ParameterError) as raised:
        DIALECTS[dialect].generate_request("rid-1", [1, 2, 3], params, params.detok)
    assert raised.value.param == param


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_output_logprobs_become_bus_entries(dialect: str) -> None:
    module = DIALECTS[dialect].pb2
    top = [module.TopLogProbs(values=[-0.5, -1.5], token_ids=[7, 9]), module.TopLogProbs(values=[-0.25], token_ids=[8])]
    logprobs = module.OutputLogProbs(token_logprobs=[-0.5, -0.25], token_ids=[7, 8], top_logprobs=top)
    chunk = module.GenerateStreamChunk(token_ids=[7, 8], output_logprobs=logprobs)
    assert output_logprobs(chunk) == [TokenLogprob(-0.5, [7, 9], [-0.5, -1.5]), TokenLogprob(-0.25, [8], [-0.25])]
    complete = module.GenerateComplete(output_ids=[7, 8], finish_reason="stop", output_logprobs=logprobs)
    assert output_logprobs(complete, skip=1) == [TokenLogprob(-0.25, [8], [-0.25])]  # cumulative: past the streamed
    assert output_logprobs(module.GenerateStreamChunk(token_ids=[7])) is None
