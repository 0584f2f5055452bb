"""A /v1/completions request with several prompts (OpenAI's batch form: a list of strings or of token-id lists).

Each prompt runs as its own request through the one generation path (its rid `<rid>-<p>`), all at once; the answer
is vLLM's: one body whose choices are every prompt's, prompt p's choice j at index p * n + j, each with its own
text, echo, logprobs and ids, and the usage summed over the prompts (each prompt's tokens once). Streamed, every
choice of every prompt is in one stream, numbered so, each chunk shaped by its prompt's formatter (BatchFormatter).
A prompt that fails fails the request with its error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from detok_worker.bus.messages import LogprobText
from detok_worker.front import sse
from detok_worker.front.choices import Choices
from detok_worker.front.openai_api import CompletionRequest
from detok_worker.front.request_stream import RequestStream
from detok_worker.front.responses import CompletionFormatter, TokenIds


def batch_prompts(request: CompletionRequest) -> list[Any] | None:
    """The prompts of a request that has more than one (each a string or a list of token ids), else None."""
    prompt = request.prompt
    if not isinstance(prompt, list) or len(prompt) < 2:
        return None
    if all(isinstance(item, str) for item in prompt) or all(isinstance(item, list) for item in prompt):
        return list(prompt)
    return None  # token ids (or a mix, which the prompt check refuses)


def one_prompt(request: CompletionRequest, prompt: Any) -> CompletionRequest:
    return msgspec.structs.replace(request, prompt=prompt)


def merged_body(rid: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """One completions body from each prompt's (in prompt order): choices renumbered, usage summed."""
    choices = []
    for prompt_index, body in enumerate(bodies):
        n = len(body["choices"])
        for choice in body["choices"]:
            choices.append({**choice, "index": prompt_index * n + choice["index"]})
    merged = {**bodies[0], "id": rid, "choices": choices}
    usages = [body["usage"] for body in bodies]
    merged["usage"] = {
        **usages[0],
        **{key: sum(usage[key] for usage in usages) for key in ("prompt_tokens", "completion_tokens", "total_tokens")},
    }
    return merged


class BatchFormatter:
    """The chunks of a streamed request with several prompts: choice `index` (prompt index // per_prompt) by its
    prompt's formatter, which writes that index (its own per-choice state is keyed by it); the usage chunk over
    every prompt's choices. One response: one id and creation time."""

    framing = sse.OPENAI_FRAMING

    def __init__(self, formatters: list[CompletionFormatter], per_prompt: int) -> None:
        self.formatters = formatters
        self.per_prompt = per_prompt
        for formatter in formatters[1:]:
            formatter.created = formatters[0].created
        self.token_ids: TokenIds | None = formatters[0].token_ids
        self.include_usage = formatters[0].include_usage

    def _of(self, index: int) -> CompletionFormatter:
        return self.formatters[index // self.per_prompt]

    def first_chunks(self, index: int, stream: RequestStream) -> list[bytes]:
        return self._of(index).first_chunks(index, stream)

    def text_chunk(
        self,
        index: int,
        text: str,
        stream: RequestStream,
        logprobs: list[LogprobText] | None = None,
        token_ids: list[int] | None = None,
    ) -> bytes:
        return self._of(index).text_chunk(index, text, stream, logprobs, token_ids)

    def text_event(self, index: int, stream: RequestStream) -> Callable[[str], bytes] | None:
        return self._of(index).text_event(index, stream)

    def final_chunk(self, index: int, stream: RequestStream) -> bytes:
        return self._of(index).final_chunk(index, stream)

    def usage_chunk(self, choices: Choices) -> bytes:
        return self.formatters[0].usage_chunk(choices)
