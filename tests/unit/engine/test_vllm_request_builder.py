"""RequestBuilder (engine/vllm_requests.py), run in vLLM's virtualenv: a Submit becomes vLLM's request with vLLM's
server defaults (the generation config's sampling fields where the request gives none, max_tokens by vLLM's rule)
and the LoRA adapter and session the request names. vLLM's InputProcessor is replaced by a recorder of what it is
given; the model config is vLLM's own ModelConfig fields' stand-in (max_model_len, the diff sampling params)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers.vllm_cpu import model_dir, run_vllm_script

SCRIPT = """
import json
from types import SimpleNamespace
from vllm.lora.request import LoRARequest
from detok_worker.bus.messages import DetokParams, RequestParams, SamplingParams, Submit
from detok_worker.errors import ParameterError
from detok_worker.engine.vllm_requests import RequestBuilder

class Recorder:
    tokenizer = None
    def process_inputs(self, rid, prompt, params, tasks, arrival, lora_request=None, priority=0, session_id=None):
        return {"rid": rid, "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                "max_tokens": params.max_tokens, "lora": lora_request and [lora_request.lora_name,
                lora_request.lora_int_id, lora_request.lora_path], "session_id": session_id,
                "thinking_token_budget": params.thinking_token_budget, "extra_args": params.extra_args}

model = SimpleNamespace(max_model_len=100, generation_config="auto", override_generation_config={},
                        get_diff_sampling_param=lambda: {"temperature": 0.6, "top_k": 20, "top_p": 0.95})
adapter = LoRARequest(lora_name="adapter", lora_int_id=1, lora_path="/adapters/a")
builder = RequestBuilder(Recorder(), model, {"adapter": adapter})

def build(params):
    try:
        return builder.build(Submit("r", list(range(10)), params), params.detok)
    except ParameterError as error:
        return {"refused": error.param}

print(json.dumps([
    build(RequestParams(16)),
    build(RequestParams(16, sampling=SamplingParams(temperature=1.0, top_k=-1))),
    build(RequestParams(1000, engine_max_tokens=True)),
    build(RequestParams(95)),
    build(RequestParams(101)),
    build(RequestParams(8, lora="adapter")),
    build(RequestParams(8, lora="other")),
    build(RequestParams(8, session_id="conv-1", sampling=SamplingParams(thinking_token_budget=32,
                                                                         extra_args={"k": [1, "a"]}))),
    RequestBuilder(Recorder(), SimpleNamespace(
        max_model_len=100, generation_config="auto", override_generation_config={},
        get_diff_sampling_param=lambda: {"temperature": 0.6, "max_tokens": 64, "odd": [1], "flag": True},
    )).numeric_defaults(),
]))
"""


@pytest.fixture(scope="module")
def answers() -> list[Any]:
    """What SCRIPT and TOOL_SCRIPT print (each a JSON list, after vLLM's log lines)."""
    printed = [run_vllm_script(script, [model_dir()]) for script in (SCRIPT, TOOL_SCRIPT)]
    return [json.loads([line for line in text.splitlines() if line.startswith("[")][-1]) for text in printed]


def test_defaults_max_tokens_and_the_lora_adapter_reach_vllms_request(answers: list[Any]) -> None:
    *built, in_session, _ = answers[0]
    defaulted, given, engine_max, cut, too_many, on_adapter, unknown = built
    assert (defaulted["temperature"], defaulted["top_k"], defaulted["top_p"]) == (0.6, 20, 0.95)
    assert (given["temperature"], given["top_k"], given["top_p"]) == (1.0, 0, 0.95)  # top_k -1: off, vLLM's 0
    assert engine_max["max_tokens"] == 90  # the rest of the 100-token context after 10 prompt ids
    assert cut["max_tokens"] == 90 and defaulted["max_tokens"] == 16
    assert too_many == {"refused": "max_tokens"}  # above the context: vLLM's 400
    assert on_adapter["lora"] == ["adapter", 1, "/adapters/a"] and defaulted["lora"] is None
    assert unknown == {"refused": "model"}
    assert in_session["session_id"] == "conv-1" and defaulted["session_id"] is None  # vLLM's session_id
    assert (in_session["thinking_token_budget"], defaulted["thinking_token_budget"]) == (32, None)
    assert (in_session["extra_args"], defaulted["extra_args"]) == ({"k": [1, "a"]}, None)  # vllm_xargs


def test_the_fronts_get_the_defaults_that_are_numbers(answers: list[Any]) -> None:
    """EngineStats.sampling_defaults: a value of another type in a generation config (which may hold anything)
    would make the fronts drop the whole frame."""
    assert answers[0][-1] == {"temperature": 0.6, "max_tokens": 64}


TOOL_SCRIPT = """
import json, sys
from types import SimpleNamespace
from vllm.tokenizers import get_tokenizer
from detok_worker.bus.messages import CONSTRAINT_TOOL_CALLS, Constraint, RequestParams, SamplingParams, Submit
from detok_worker.errors import ParameterError
from detok_worker.engine.vllm_requests import RequestBuilder
from detok_worker.engine.vllm_tool_grammar import ToolGrammar

class Recorder:
    tokenizer = None
    def process_inputs(self, rid, prompt, params, tasks, arrival, lora_request=None, priority=0, session_id=None):
        tag = params.structured_outputs and params.structured_outputs.structural_tag
        return {"tag": tag and json.loads(tag)}

tokenizer = get_tokenizer(sys.argv[1])
model = SimpleNamespace(max_model_len=100, generation_config="auto", override_generation_config={},
                        get_diff_sampling_param=lambda: {}, model=sys.argv[1],
                        hf_config=SimpleNamespace(model_type="qwen3"))
args = SimpleNamespace(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser=None,
                       tool_strict_level="auto")
with_grammar = RequestBuilder(Recorder(), model, tool_grammar=ToolGrammar.from_args(args, model, tokenizer))
without = RequestBuilder(Recorder(), model)
tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}}

def build(builder, **fields):
    spec = json.dumps({"tools": [tool], "tool_choice": None, "parallel_tool_calls": None, **fields})
    params = RequestParams(8, sampling=SamplingParams(constraint=Constraint(CONSTRAINT_TOOL_CALLS, spec)))
    try:
        return builder.build(Submit("r", list(range(10)), params), params.detok)
    except ParameterError as error:
        return {"refused": error.param}

print(json.dumps([
    build(with_grammar, tool_choice="required"),
    build(with_grammar, tool_choice={"type": "function", "function": {"name": "weather"}}),
    build(with_grammar, tool_choice="auto"),
    build(with_grammar, tool_choice="auto", parallel_tool_calls=False),
    build(with_grammar, tool_choice="required", tools="not a list"),
    build(without, tool_choice="required"),
]))
"""


def test_the_tool_grammar_is_vllms_structural_tag_of_the_tool_call_parser(answers: list[Any]) -> None:
    """With hermes: tool_choice required / named get hermes's `<tool_call>` tag over the tools, auto none unless
    parallel_tool_calls is false (then a tag triggered by `<tool_call>`), as vLLM's parser adjusts a request."""
    required, named, auto, single_auto, bad_tools, no_parser = answers[1]
    for built in (required, named):
        text = json.dumps(built["tag"])
        assert "<tool_call>" in text and '\\"weather\\"' in text, text
    assert auto == {"tag": None}
    assert single_auto["tag"]["format"]["triggers"] == ["<tool_call>"]
    assert bad_tools == {"refused": "request"}  # vLLM's request model refuses it
    assert no_parser == {"refused": "tool_choice"}
