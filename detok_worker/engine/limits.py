"""What the engine accepts in a Submit, checked again at the engine: any same-uid bus peer can send one without
the front's validation (max_tokens 2**40, a prompt of millions of ids, a billion logprobs per token)."""

from __future__ import annotations

from dataclasses import dataclass

from detok_worker.bus.messages import MAX_TOP_LOGPROBS, RequestParams
from detok_worker.config import DetokConfig
from detok_worker.config.schema import PROMPT_TOKENS_CAP


@dataclass(frozen=True, slots=True)
class SubmitLimits:
    max_tokens: int
    max_prompt_tokens: int

    @classmethod
    def from_config(cls, config: DetokConfig) -> SubmitLimits:
        """The front's limits: front.max_tokens_limit, and front.max_prompt_tokens (or the cap when it is 0, as
        the engine does not know the tokenizer's model_max_length)."""
        front = config.front
        return cls(front.max_tokens_limit, front.max_prompt_tokens or PROMPT_TOKENS_CAP)

    def check(self, prompt_ids: list[int], params: RequestParams) -> str | None:
        """Why the engine refuses this request, or None."""
        if not 0 <= params.max_tokens <= self.max_tokens:
            return f"max_tokens must be between 0 and {self.max_tokens}, got {params.max_tokens}"
        if len(prompt_ids) > self.max_prompt_tokens:
            return f"the prompt has {len(prompt_ids)} tokens; at most {self.max_prompt_tokens} are allowed"
        top = params.sampling.logprobs
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            return f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}"
        return None


NO_SUBMIT_LIMITS = SubmitLimits(2**62, 2**62)
