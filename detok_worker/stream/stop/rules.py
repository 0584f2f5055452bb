"""StopRules: one request's stop rule, validated once, and the one place that knows it.

Every process goes through it: the front validates a request's stop fields (a ParameterError names the parameter,
the front turns it into a 400), the engine adds the tokenizer's EOS ids (the EOS rule: unless ignore_eos, an EOS
token ends the request like a hidden stop token), the worker builds its StopSequenceDecoder from it, the front
maps the stop reason a worker reports back to what OpenAI clients expect (null for EOS). Limits come from
`[worker]` max_stop_strings / max_stop_string_chars.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from detok_worker.bus.messages import DetokParams
from detok_worker.config import DetokConfig
from detok_worker.errors import ParameterError
from detok_worker.stream.stop.outputs import StopReason
from detok_worker.stream.stop.settings import (
    StopSequenceConfig,
    check_min_tokens,
    check_stop_string,
    check_stop_token_id,
)


@dataclass(frozen=True, slots=True)
class StopLimits:
    # stop strings per request; stop token ids have no count of their own (vLLM's VLLM_MAX_STOP_STRINGS bounds the
    # strings only, and the worker's ids include the EOS ids the engine added): the body size bounds them
    max_strings: int = 64
    max_string_chars: int = 1024

    @classmethod
    def from_config(cls, config: DetokConfig) -> StopLimits:
        return cls(config.worker.max_stop_strings, config.worker.max_stop_string_chars)


DEFAULT_STOP_LIMITS = StopLimits()


@dataclass(frozen=True, slots=True)
class StopRules:
    params: DetokParams  # as the client asked (no EOS ids added)
    eos_ids: frozenset[int]  # the tokenizer's EOS ids this request stops on (empty with ignore_eos)

    @classmethod
    def from_params(
        cls, params: DetokParams, limits: StopLimits, eos_ids: Iterable[int] = (), *, ignore_eos: bool = False
    ) -> StopRules:
        """Validate `params` against `limits`; raises ParameterError naming the field."""
        if len(params.stop) > limits.max_strings:
            raise ParameterError(
                f"at most {limits.max_strings} stop strings are allowed (got {len(params.stop)})", "stop"
            )
        for text in params.stop:
            if len(check_stop_string(text, "stop")) > limits.max_string_chars:
                raise ParameterError(f"a stop string is longer than {limits.max_string_chars} characters", "stop")
        for token_id in params.stop_token_ids:
            check_stop_token_id(token_id, "stop_token_ids")
        check_min_tokens(params.min_tokens)
        return cls(params, frozenset() if ignore_eos else frozenset(eos_ids))

    @property
    def stop_chars(self) -> int:
        """Characters of the stop strings: what the request holds of its worker's worker.max_live_stop_chars."""
        return sum(len(text) for text in self.params.stop)

    def worker_params(self) -> DetokParams:
        """What the worker gets: the client's params with the EOS ids added to the stop token ids."""
        if not self.eos_ids:
            return self.params
        stop_ids = list(dict.fromkeys([*self.params.stop_token_ids, *sorted(self.eos_ids)]))
        return msgspec.structs.replace(self.params, stop_token_ids=stop_ids)

    def decoder_config(self) -> StopSequenceConfig:
        """include_stop_str_in_output makes stop strings and stop tokens visible; otherwise both are hidden."""
        params = self.worker_params()
        if params.include_stop_str_in_output:
            return StopSequenceConfig(visible_stop_tokens=params.stop_token_ids, visible_stop_sequences=params.stop)
        return StopSequenceConfig(stop_tokens=params.stop_token_ids, stop_sequences=params.stop)

    def client_stop_reason(self, reason: StopReason | None) -> StopReason | None:
        """OpenAI and vLLM report stop_reason null when generation ended on EOS."""
        return None if isinstance(reason, int) and reason in self.eos_ids else reason
