"""vLLM's `prompt_logprobs` as its OpenAI server answers them, from the engine's PromptLogprobs (bus/messages.py):
one entry per prompt token, None for the first (nothing precedes it), then {token id: {logprob, rank,
decoded_token}} with the prompt token first and the engine's top candidates after it (ranks 1..k; a prompt token
that is also a top candidate keeps its first place with the candidate's values, as vLLM's dict does).

`decoded_token` is the token string of stream/decode/token_strings.py, with the one to four prompt tokens before its
position as the context that completes a split character (the first prompt token never counts: it has no entry).
-inf values are -9999.0 (vLLM's JSON-safe clamp).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from detok_worker.bus.messages import PromptLogprobs
from detok_worker.front.errors import ENGINE_ERROR, APIError
from detok_worker.front.openai_api import CompletionLogprobs, PromptLogprobOut, PromptLogprobsOut
from detok_worker.front.request_stream import RequestStream
from detok_worker.stream.decode.token_strings import CONTEXT_TOKENS, TokenStrings
from detok_worker.tokenizer.protocol import Tokenizer

NEG_INF_AS = -9999.0
# The engine sends a request's prompt logprobs before its first ids, straight to the front, while the text goes
# through a worker: they almost always arrive first. A request whose text ended before them waits this long.
ARRIVAL_WAIT_S = 5.0


class PromptLogprobsError(ValueError):
    """The engine's prompt logprobs do not fit the prompt (a misbehaving engine)."""


def _value(logprob: float) -> float:
    return NEG_INF_AS if logprob == float("-inf") else logprob


def render_prompt_logprobs(
    message: PromptLogprobs, prompt_ids: Sequence[int], k: int, tokenizer: Tokenizer
) -> PromptLogprobsOut:
    """The client's prompt_logprobs for `prompt_ids` with `k` top candidates asked (-1: all the engine sent)."""
    rows, values, ranks = message.token_ids, message.logprobs, message.ranks
    expected = max(len(prompt_ids) - 1, 0)
    if not len(rows) == len(values) == len(ranks) == expected:
        raise PromptLogprobsError(f"{len(rows)} rows of prompt logprobs for a prompt of {len(prompt_ids)} tokens")
    texts = TokenStrings(tokenizer)
    out: PromptLogprobsOut = [None] if prompt_ids else []
    for i, (ids, row_values, rank) in enumerate(zip(rows, values, ranks, strict=True)):
        if not ids or len(ids) != len(row_values):
            raise PromptLogprobsError(f"prompt position {i + 1}: {len(ids)} ids and {len(row_values)} logprobs")
        top = len(ids) - 1 if k == -1 else k
        context = [row[0] for row in rows[max(0, i - CONTEXT_TOKENS) : i]]
        entry: dict[int, PromptLogprobOut] = {}
        for token_id, value, token_rank in zip(ids, row_values, (rank, *range(1, top + 1)), strict=False):
            entry[token_id] = PromptLogprobOut(_value(value), token_rank, texts.at(token_id, context))
        out.append(entry)
    return out


def echo_logprobs(
    prompt_ids: Sequence[int], shown: PromptLogprobsOut, k: int, tokenizer: Tokenizer
) -> CompletionLogprobs:
    """The prompt's part of an echoed completion's `logprobs`, as vLLM's server makes it from the prompt logprobs
    (`shown`, render_prompt_logprobs): per prompt token its decoded_token and logprob, and as its top_logprobs the
    first k + 1 entries of its position (itself first); the first token, which has no entry, its decode alone and
    nulls. text_offset counts from the start of the echoed prompt."""
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for token_id, entry in zip(prompt_ids, shown, strict=True):
        if entry is None:
            token, value, top = tokenizer.decode([token_id]), None, None
        else:
            own = entry[token_id]
            token, value = own.decoded_token or "", own.logprob
            top = {}
            for place, candidate in enumerate(entry.values()):
                if place > k:
                    break
                top[candidate.decoded_token or ""] = candidate.logprob
        tokens.append(token)
        values.append(value)
        tops.append(top)
        offsets.append(offset)
        offset += len(token)
    return CompletionLogprobs(tokens, values, tops, offsets)


def echo_end(echoed: CompletionLogprobs) -> int:
    """The text offset of the output's first token after the prompt's part of an echoed completion's `logprobs`."""
    return echoed.text_offset[-1] + len(echoed.tokens[-1]) if echoed.tokens else 0


def after_echo(echoed: CompletionLogprobs, output: CompletionLogprobs) -> CompletionLogprobs:
    """An echoed completion's whole `logprobs`: the prompt's part, then the output's with its text offsets moved past
    the prompt's text."""
    end = echo_end(echoed)
    return CompletionLogprobs(
        echoed.tokens + output.tokens,
        echoed.token_logprobs + output.token_logprobs,
        echoed.top_logprobs + output.top_logprobs,
        echoed.text_offset + [end + offset for offset in output.text_offset],
    )


async def arrived(stream: RequestStream) -> PromptLogprobs:
    """The prompt logprobs of a choice that asked for them (its text has ended), waiting ARRIVAL_WAIT_S at most for
    them; an APIError (502) if the engine sent none."""
    await prompt_info(stream, lambda: stream.prompt_logprobs is not None)
    if stream.prompt_logprobs is None:
        raise APIError(502, "the engine sent no prompt logprobs for the request", type=ENGINE_ERROR)
    return stream.prompt_logprobs


async def prompt_info(stream: RequestStream, ready: Callable[[], bool]) -> None:
    """Wait ARRIVAL_WAIT_S at most for what the engine tells of a choice's prompt (its text has ended: the engine
    sent it at the prefill's end, on another connection than the text)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ARRIVAL_WAIT_S
    while not ready() and (remaining := deadline - loop.time()) > 0:
        stream.wakeup.clear()
        try:
            await asyncio.wait_for(stream.wakeup.wait(), remaining)
        except TimeoutError:
            break
