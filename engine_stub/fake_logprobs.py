"""Deterministic fake logprobs for the planning sources' output, so logprobs are testable end to end without a model.

The value of id `t` at output position `p` is a pure function of (p, t) (never of the rid): -(crc32("p:t") mod
10000) / 1000, in (-10, 0]. The top candidates at a position are the sampled id plus top-1 other valid ids
picked from (p, t), most likely first.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from detok_worker.bus.messages import TokenLogprob
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, validate_token_ids

_STRIDE = 7919  # a prime: successive candidates spread over the vocabulary


def fake_value(position: int, token_id: int) -> float:
    return -(zlib.crc32(f"{position}:{token_id}".encode()) % 10000) / 1000


def fake_logprobs(ids: Sequence[int], top: int, tokenizer: Tokenizer) -> list[TokenLogprob]:
    """One entry per id of `ids` (the output from its first position), each with `top` candidates."""
    return [_entry(position, token_id, top, tokenizer) for position, token_id in enumerate(ids)]


def _entry(position: int, token_id: int, top: int, tokenizer: Tokenizer) -> TokenLogprob:
    candidates: list[int] = [token_id] if top else []
    vocab = tokenizer.vocab_size
    step = 1
    while len(candidates) < min(top, vocab) and step <= 4 * top + 64:
        other = (token_id + step * _STRIDE + position) % vocab
        step += 1
        if other in candidates or not _valid(tokenizer, other):
            continue
        candidates.append(other)
    ranked = sorted(candidates, key=lambda candidate: fake_value(position, candidate), reverse=True)
    return TokenLogprob(fake_value(position, token_id), ranked, [fake_value(position, c) for c in ranked])


def _valid(tokenizer: Tokenizer, token_id: int) -> bool:
    try:
        validate_token_ids(tokenizer, [token_id])
    except InvalidTokenIdError:
        return False
    return True
