"""An engine's batches for a WorkerState, and what a front sees of them: requests fed mostly one id per step (some
steps several), each request's last item with finish "length", as items or in the batches' columns."""

from __future__ import annotations

import random
from dataclasses import dataclass

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, TokenBatch, Tokens
from detok_worker.worker.state import WorkerState

# per rid its deltas as (offset, text, n_tokens, finish, stop_reason, error)
Delta = tuple[int, str, int, str | None, str | int | None, str | None]


@dataclass(frozen=True)
class Request:
    params: DetokParams
    ids: list[int]
    vocab_size: int = 0  # Open.vocab_size: the engine's vocabulary size


def engine_batches(requests: list[Request], seed: int) -> list[TokenBatch]:
    """Rid r<index> per request: its Open first, then mostly one id per step, sometimes several; the last item of a
    request carries finish "length"."""
    rng = random.Random(seed)
    opens = [
        Open(f"r{index}", [], request.params, vocab_size=request.vocab_size) for index, request in enumerate(requests)
    ]
    batches = [TokenBatch(0, 0, opens, [])]
    positions = [0] * len(requests)
    step = 0
    while any(position < len(request.ids) for position, request in zip(positions, requests, strict=True)):
        step += 1
        items = []
        for index, request in enumerate(requests):
            ids, start = request.ids, positions[index]
            if start >= len(ids):
                continue
            end = min(len(ids), start + (1 if rng.random() < 0.85 else rng.randint(2, 4)))
            positions[index] = end
            items.append(Tokens(f"r{index}", ids[start:end], "length" if end == len(ids) else None))
        batches.append(TokenBatch(step, 0, [], items))
    return batches


def columnar(batches: list[TokenBatch]) -> list[TokenBatch]:
    """The same batches with every usual item (one id, nothing else) in the columns."""
    return [token_batch(batch.step, batch.sent_ns, batch.opens, batch.items) for batch in batches]


def run_batches(state: WorkerState, batches: list[TokenBatch]) -> tuple[dict[str, list[Delta]], list[tuple]]:
    """Per rid its deltas in order (a batch's columns and items interleave rids differently), the Finishes sorted."""
    deltas: dict[str, list[Delta]] = {}
    finishes = []
    for batch in batches:
        result = state.handle_batch(batch)
        for d in text_deltas(result.text_batch):
            deltas.setdefault(d.rid, []).append((d.offset, d.text, d.n_tokens, d.finish, d.stop_reason, d.error))
        finishes += [(f.rid, f.reason, f.stop_reason) for f in result.finishes]
    return deltas, sorted(finishes)
