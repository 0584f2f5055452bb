"""A /v1/completions request with several prompts (OpenAI's batch form: a list of strings or of token-id lists).

Each prompt runs as its own request through the one generation path (its rid `<rid>-<p>`), all at once; the answer
is vLLM's: one body whose choices are every prompt's, prompt p's choice j at index p * n + j, each with its own
text, echo, logprobs and ids, and the usage summed over the prompts. A prompt that fails fails the request with its
error.
"""

from __future__ import annotations

from typing import Any

import msgspec

from detok_worker.front.openai_api import CompletionRequest


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
