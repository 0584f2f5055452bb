"""detok's bus messages as vLLM engine-core messages, and back: a Submit as an `EngineCoreRequest`, an
`EngineCoreOutput`'s finish and logprobs as the bus's.

Everything goes through vLLM's own classes and rules (`SamplingParams`, `InputProcessor`, `get_max_tokens`), so vLLM
validates a request and applies the model's generation config (EOS ids, sampling defaults, max_tokens up to the
context) exactly as its own server does. The
engine core never detokenizes (`detokenize=False`) and sends only the new ids of a step (`output_kind=DELTA`);
stop strings stay in detok's workers. Imported only by the vLLM source (it needs vLLM installed).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from vllm.config import ModelConfig
from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
from vllm.exceptions import VLLMValidationError
from vllm.inputs.engine import tokens_input
from vllm.lora.request import LoRARequest
from vllm.renderers.params import TokenizeParams
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.sampling_params import SamplingParams as VllmSamplingParams
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.outputs import LogprobsTensors

from detok_worker.bus.messages import (
    CONSTRAINT_CHOICE,
    CONSTRAINT_GRAMMAR,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_REGEX,
    CONSTRAINT_STRUCTURAL_TAG,
    CONSTRAINT_TOOL_CALLS,
    FINISH_LENGTH,
    FINISH_STOP,
    Constraint,
    DetokParams,
    PromptLogprobs,
    Submit,
    TokenLogprob,
)
from detok_worker.bus.request_fields import VLLM_PASSED
from detok_worker.engine.vllm_tool_grammar import ToolGrammar
from detok_worker.errors import ParameterError

# how the engine core ends a request -> the bus's finish; ABORT and ERROR are handled by the source itself
FINISHES = {FinishReason.STOP: FINISH_STOP, FinishReason.LENGTH: FINISH_LENGTH, FinishReason.REPETITION: FINISH_STOP}
SUPPORTED_TASKS = ("generate",)
# a constraint kind whose spec is the whole constraint -> StructuredOutputsParams' keyword for it
_SPEC_KEYWORDS = {
    CONSTRAINT_JSON_SCHEMA: "json",
    CONSTRAINT_REGEX: "regex",
    CONSTRAINT_GRAMMAR: "grammar",
    CONSTRAINT_STRUCTURAL_TAG: "structural_tag",
}
# a PromptLogprobs frame's bytes per (id, logprob) pair at most: a msgpack uint32 and a float64, with room to spare
FRAME_BYTES_PER_VALUE = 16


class RequestBuilder:
    """Submit -> EngineCoreRequest, through vLLM's InputProcessor (validation, generation config) with vLLM's
    server defaults: the sampling fields a request leaves out from the generation config
    (`ModelConfig.get_diff_sampling_param`: `--generation-config`, `--override-generation-config`), and max_tokens
    by vLLM's own rule (`get_max_tokens`: the rest of the context, capped by the generation config)."""

    def __init__(
        self,
        processor: InputProcessor,
        model_config: ModelConfig,
        loras: Mapping[str, LoRARequest] | None = None,
        tool_grammar: ToolGrammar | None = None,
    ) -> None:
        """`loras`: the LoRA adapters loaded into the engine core, by the name requests give (RequestParams.lora); a
        live table (LoraAdapters.requests: adapters come and go at run time).
        `tool_grammar`: builds the grammar of a CONSTRAINT_TOOL_CALLS constraint (none: such requests are refused)."""
        self.processor = processor
        self.tool_grammar = tool_grammar
        self.loras = loras if loras is not None else {}
        self.max_model_len = model_config.max_model_len
        self.defaults: dict[str, Any] = model_config.get_diff_sampling_param()
        # vLLM's serving classes: a generation config directory's max_new_tokens caps every request, as does
        # --override-generation-config's
        self.override_max_tokens: int | None = (
            self.defaults.get("max_tokens")
            if model_config.generation_config not in ("auto", "vllm")
            else model_config.override_generation_config.get("max_new_tokens")
        )

    def numeric_defaults(self) -> dict[str, int | float]:
        """The sampling defaults that are numbers (all of vLLM's are; a generation config may hold anything), for
        the fronts (EngineStats.sampling_defaults)."""
        return {
            name: value
            for name, value in self.defaults.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }

    def build(self, submit: Submit, detok: DetokParams) -> EngineCoreRequest:
        """Raises ParameterError (the client's parameter, answered with a 400 naming it) when vLLM refuses
        the request."""
        params = submit.params
        sampling = params.sampling
        defaults = self.defaults
        # the table's fields by name (bus/request_fields.py); a defaulted one the client left unset: the model's
        # generation config's value, as vLLM's server fills it (its requests' to_sampling_params)
        fields: dict[str, Any] = {}
        for field, defaulted in VLLM_PASSED:
            value = getattr(sampling, field.name)
            if field.asks(value) or defaulted and (value := defaults.get(field.name)) is not None:
                fields[field.name] = value
        if fields.get("top_k", 0) < 0:  # detok's "off" (-1); vLLM's is 0
            fields["top_k"] = 0
        if sampling.logprob_token_ids:  # vLLM's server: those ids' logprobs in place of the top candidates
            fields.pop("logprobs", None)
        lora = None
        if params.lora:
            lora = self.loras.get(params.lora)
            if lora is None:
                raise ParameterError(f"the LoRA adapter {params.lora!r} is not loaded in the engine", "model")
        if sampling.bad_words and self.processor.tokenizer is None:  # vLLM would drop them without a tokenizer
            raise ParameterError("bad_words need vLLM's tokenizer (no --skip-tokenizer-init)", "bad_words")
        requested = None if params.engine_max_tokens else params.max_tokens
        try:
            # vLLM's server: a max_tokens above the context is refused, one above what the prompt leaves is cut
            TokenizeParams(
                max_total_tokens=self.max_model_len,
                max_output_tokens=requested or 0,
                max_total_tokens_param="max_model_len",
                max_output_tokens_param="max_tokens",
            )
            max_tokens = get_max_tokens(
                self.max_model_len,
                requested,
                len(submit.prompt_ids),
                defaults,
                self.override_max_tokens,
            )
            sampling_params = VllmSamplingParams.from_optional(
                n=1,  # the front fans n out into one engine request per choice
                max_tokens=max_tokens,
                min_tokens=detok.min_tokens,
                stop_token_ids=list(params.detok.stop_token_ids),
                ignore_eos=params.ignore_eos,
                structured_outputs=structured_outputs(sampling.constraint, self.tool_grammar),
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
                **fields,
            )
            prompt = tokens_input(list(submit.prompt_ids), cache_salt=params.cache_salt)
            return self.processor.process_inputs(
                submit.rid,
                prompt,
                sampling_params,
                SUPPORTED_TASKS,
                time.time(),
                lora_request=lora,
                priority=params.priority,
                session_id=params.session_id,
            )
        except ParameterError:
            raise
        except VLLMValidationError as exc:
            raise ParameterError(f"vLLM refused the request: {exc}", exc.parameter or "request") from exc
        except ValueError as exc:
            raise ParameterError(f"vLLM refused the request: {exc}", "request") from exc


def structured_outputs(
    constraint: Constraint | None, tool_grammar: ToolGrammar | None = None
) -> StructuredOutputsParams | None:
    if constraint is None:
        return None
    kind = constraint.kind
    if kind == CONSTRAINT_TOOL_CALLS:
        if tool_grammar is None:
            raise ParameterError("the engine has no tool-call parser to build the grammar from", "tool_choice")
        return tool_grammar.structured_outputs(constraint.spec)
    if kind == CONSTRAINT_JSON_OBJECT:
        return StructuredOutputsParams(json_object=True)
    if kind == CONSTRAINT_CHOICE:
        return StructuredOutputsParams(choice=list(constraint.choices))
    if (keyword := _SPEC_KEYWORDS.get(kind)) is not None:
        return StructuredOutputsParams(**{keyword: constraint.spec})
    raise ParameterError(f"unknown constraint kind {kind!r}", "response_format")


def output_logprobs(output: EngineCoreOutput) -> list[TokenLogprob] | None:
    """One bus entry per new id: vLLM's rows hold the sampled id's logprob first, then the top ones."""
    lists = output.new_logprobs
    if lists is None:
        return None
    ids = lists.logprob_token_ids.tolist()
    values = lists.logprobs.tolist()
    return [TokenLogprob(row[0], top_ids[1:], row[1:]) for top_ids, row in zip(ids, values, strict=True)]


class PromptRows:
    """The prompt logprobs of one request as the engine core computes them: one tensor triple per prefill chunk
    (a long prompt's prefill can take several steps), joined into one PromptLogprobs when its prefill is done.
    Rows whose frame would pass `max_bytes` (the bus's bus.max_message_bytes: a bigger frame would cost the front
    its connection to the engine) are dropped as they come, and the request is `too_large`."""

    __slots__ = ("rid", "token_ids", "logprobs", "ranks", "max_values", "values", "too_large")

    def __init__(self, rid: str, max_bytes: int) -> None:
        self.rid = rid
        self.token_ids: list[list[int]] = []
        self.logprobs: list[list[float]] = []
        self.ranks: list[int] = []
        self.max_values = max_bytes // FRAME_BYTES_PER_VALUE
        self.values = 0
        self.too_large = False

    def add(self, tensors: LogprobsTensors) -> None:
        """A chunk's rows: each holds the prompt token's id, then its position's top ids (vLLM puts it first)."""
        self.values += tensors.logprobs.numel()
        if self.too_large or self.values > self.max_values:
            self.too_large = True
            self.token_ids, self.logprobs, self.ranks = [], [], []
            return
        self.token_ids += tensors.logprob_token_ids.tolist()
        self.logprobs += tensors.logprobs.tolist()
        self.ranks += tensors.selected_token_ranks.tolist()

    def message(self) -> PromptLogprobs:
        return PromptLogprobs(self.rid, self.token_ids, self.logprobs, self.ranks)
