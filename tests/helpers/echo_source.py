"""What engine_stub's echo source generates, computed from the tokenizer alone: the prompt's own ids, then EOS."""

from __future__ import annotations

from typing import Any

from engine_stub.planned import primary_eos_id


def expected_echo(
    tokenizer: Any, prompt_ids: list[int], max_tokens: int, stop_ids: set[int] | None = None
) -> tuple[str, str, int]:
    """(text, finish_reason, completion_tokens) of the echo source: prompt ids + EOS, cut by max_tokens and the
    first stop token (the tokenizer's EOS ids, hidden)."""
    eos_ids = set(tokenizer.eos_token_ids) | (stop_ids or set())
    planned = [*prompt_ids, primary_eos_id(tokenizer)]
    output = planned[:max_tokens]
    for index, token_id in enumerate(output):
        if token_id in eos_ids:
            return tokenizer.decode(output[:index], skip_special_tokens=True), "stop", index + 1
    return tokenizer.decode(output, skip_special_tokens=True), "length", len(output)


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)).ids
