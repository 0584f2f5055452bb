"""`detok trace synth`: a trace built from text (a corpus of passages or ShareGPT-style conversations).

Prompts go through the chat template; outputs are the texts' tokens then EOS; arrivals are Poisson and tokens
come at a fixed inter-token time; seeded, so the same inputs give the same trace.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path

from detok_worker.bus.messages import RequestParams
from detok_worker.tokenizer.chat.template import ChatTemplateNotFoundError
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import RecordedRequest, Trace, TraceInputError, make_header

SHAREGPT_ROLES = {
    **dict.fromkeys(("human", "user"), "user"),
    **dict.fromkeys(("gpt", "assistant", "chatgpt", "bard", "model"), "assistant"),
    "system": "system",
}


def sharegpt_conversations(path: Path) -> list[list[dict[str, str]]]:
    """Conversations as chat messages, from a ShareGPT file ({"conversations": [{"from", "value"}]}) or an
    OpenAI-style one ({"messages": [{"role", "content"}]}); a top-level list or {"data": [...]}."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceInputError(f"cannot read ShareGPT JSON {path}: {exc}") from exc
    items = data.get("data") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise TraceInputError(f"{path}: expected a list of conversations")
    conversations = []
    for item in items:
        turns = item.get("conversations") or item.get("messages") if isinstance(item, dict) else None
        messages = []
        for turn in turns if isinstance(turns, list) else []:
            if not isinstance(turn, dict):
                continue
            role = SHAREGPT_ROLES.get(str(turn.get("from", turn.get("role", ""))).lower())
            content = turn.get("value", turn.get("content"))
            if role and isinstance(content, str):
                messages.append({"role": role, "content": content})
        if messages:
            conversations.append(messages)
    if not conversations:
        raise TraceInputError(f"{path}: no conversations with user/assistant turns")
    return conversations


def chat_prompt_ids(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    except ChatTemplateNotFoundError:  # a tokenizer without a chat template: plain concatenation
        text = "\n".join(message["content"] for message in messages) + "\n"
    return tokenizer.encode(text).ids


def sharegpt_pairs(path: Path, tokenizer: Tokenizer) -> list[tuple[list[int], str]]:
    """(prompt ids, output text) for every assistant turn of every conversation."""
    pairs = []
    for messages in sharegpt_conversations(path):
        for index, message in enumerate(messages):
            if message["role"] == "assistant" and index > 0:
                pairs.append((chat_prompt_ids(tokenizer, messages[:index]), message["content"]))
    return pairs


def corpus_pairs(
    passages: list[str], count: int, tokenizer: Tokenizer, rng: random.Random
) -> list[tuple[list[int], str]]:
    """`count` requests, each asking for a passage and answered with a random one."""
    return [
        (chat_prompt_ids(tokenizer, [{"role": "user", "content": f"Write passage {i}."}]), rng.choice(passages))
        for i in range(count)
    ]


def synth_trace(
    pairs: Iterable[tuple[list[int], str]],
    tokenizer: Tokenizer,
    *,
    eos_id: int | None,
    max_tokens: int,
    rate: float,
    itl_ms: float,
    rng: random.Random,
    source: str,
    meta: dict[str, str],
) -> Trace:
    """One request per (prompt ids, text) pair: the text's tokens then EOS, cut at max_tokens."""
    step_ns = int(itl_ms * 1e6)
    requests = []
    arrival_ns = 0
    for index, (prompt_ids, text) in enumerate(pairs):
        if rate > 0 and index > 0:
            arrival_ns += int(rng.expovariate(rate) * 1e9)
        output = tokenizer.encode(text).ids
        output = [*output, eos_id] if eos_id is not None else output
        finish = "stop" if len(output) <= max_tokens and eos_id is not None else "length"
        output = output[:max_tokens]
        times = [arrival_ns + (k + 1) * step_ns for k in range(len(output))]
        params = RequestParams(max_tokens=max_tokens)
        requests.append(RecordedRequest(f"synth-{index}", arrival_ns, prompt_ids, params, output, times, finish))
    return Trace(make_header(tokenizer, source, meta), requests)
