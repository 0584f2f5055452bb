"""vLLM's `prompt_logprobs` as its OpenAI server answers them, from the engine's PromptLogprobs (bus/messages.py):
one entry per prompt token, None for the first (nothing precedes it), then {token id: {logprob, rank,
decoded_token}} with the prompt token first and the engine's top candidates after it (ranks 1..k; a prompt token
that is also a top candidate keeps its first place with the candidate's values, as vLLM's dict does).

`decoded_token` follows vLLM's output processor: the id's token string (tokenizer/token_strings.py); an id
whose decode ends with U+FFFD (part of a character) is decoded again after the one to four prompt tokens before its
position (the first prompt token never counts: it has no entry), which gives the rest of the character it
completes, or "" while it completes none. An id the tokenizer lacks (a model's vocabulary is often padded past it)
decodes to "" (Hugging Face's decode leaves it out). -inf values are -9999.0 (vLLM's JSON-safe clamp).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from detok_worker.bus.messages import PromptLogprobs
from detok_worker.front.errors import ENGINE_ERROR, APIError
from detok_worker.front.openai_api import PromptLogprobOut, PromptLogprobsOut
from detok_worker.front.request_stream import RequestStream
from detok_worker.stream.decode import decode_text
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, id_check
from detok_worker.tokenizer.token_strings import token_string, word_start_marker

REPLACEMENT = "\ufffd"
MAX_CONTEXT = 4  # vLLM's: enough preceding tokens for any UTF-8 character
NEG_INF_AS = -9999.0
# The engine sends a request's prompt logprobs before its first ids, straight to the front, while the text goes
# through a worker: they almost always arrive first. A request whose text ended before them waits this long.
ARRIVAL_WAIT_S = 5.0


class PromptLogprobsError(ValueError):
    """The engine's prompt logprobs do not fit the prompt (a misbehaving engine)."""


class _Texts:
    """Decodes as vLLM's detokenizer does for logprobs, each single id once per response."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._check = id_check(tokenizer)
        self._single: dict[int, str] = {}
        self._marker = word_start_marker(tokenizer)

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return decode_text(self.tokenizer, ids)
        except InvalidTokenIdError:
            return decode_text(self.tokenizer, [token_id for token_id in ids if self._known(token_id)])

    def _known(self, token_id: int) -> bool:
        try:
            self._check([token_id])
        except InvalidTokenIdError:
            return False
        return True

    def one(self, token_id: int) -> str:
        text = self._single.get(token_id)
        if text is None:
            text = token_string(self.tokenizer, token_id, self.decode([token_id]), self._marker)
            self._single[token_id] = text
        return text

    def corrected(self, token_id: int, context: list[int]) -> str:
        """vLLM's correction of a token that decodes to part of a character, with the prompt tokens before it."""
        for size in range(1, min(len(context), MAX_CONTEXT) + 1):
            window = context[-size:]
            full = self.decode([*window, token_id])
            if full.endswith(REPLACEMENT):
                continue
            clean_end = len(window)  # the window's own partial characters belong to this token's text
            for j in range(len(window) - 1, -1, -1):
                if not self.one(window[j]).endswith(REPLACEMENT):
                    break
                clean_end = j
            prefix = self.decode(window[:clean_end]) if clean_end else ""
            if full.startswith(prefix):
                return full[len(prefix) :]
            common = 0
            for a, b in zip(prefix, full, strict=False):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


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
    texts = _Texts(tokenizer)
    out: PromptLogprobsOut = [None] if prompt_ids else []
    for i, (ids, row_values, rank) in enumerate(zip(rows, values, ranks, strict=True)):
        if not ids or len(ids) != len(row_values):
            raise PromptLogprobsError(f"prompt position {i + 1}: {len(ids)} ids and {len(row_values)} logprobs")
        top = len(ids) - 1 if k == -1 else k
        context = [row[0] for row in rows[max(0, i - MAX_CONTEXT) : i]]
        entry: dict[int, PromptLogprobOut] = {}
        for token_id, value, token_rank in zip(ids, row_values, (rank, *range(1, top + 1)), strict=False):
            text = texts.one(token_id)
            if text.endswith(REPLACEMENT):
                text = texts.corrected(token_id, context)
            entry[token_id] = PromptLogprobOut(_value(value), token_rank, text)
        out.append(entry)
    return out


async def arrived(stream: RequestStream) -> PromptLogprobs:
    """The prompt logprobs of a choice that asked for them (its text has ended), waiting ARRIVAL_WAIT_S at most for
    them; an APIError (502) if the engine sent none."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ARRIVAL_WAIT_S
    while stream.prompt_logprobs is None and (remaining := deadline - loop.time()) > 0:
        stream.wakeup.clear()
        try:
            await asyncio.wait_for(stream.wakeup.wait(), remaining)
        except TimeoutError:
            break
    if stream.prompt_logprobs is None:
        raise APIError(502, "the engine sent no prompt logprobs for the request", type=ENGINE_ERROR)
    return stream.prompt_logprobs
