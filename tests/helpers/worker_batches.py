"""An engine's batches for a WorkerState, and what a front sees of them: requests fed mostly one id per step (some
steps several), each request's last item with finish "length", the usual ones as plain rows (the worker's hot loop)
or every one as a row with extras (its item path)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, TokenBatch, Tokens
from detok_worker.worker.state import WorkerState
from helpers.bus_rows import token_rows
from helpers.texts import load_texts

STOPS = ["\n\n", "。", "the", "🇯🇵"]
# per rid its deltas as (offset, text, n_tokens, finish, stop_reason, error)
Delta = tuple[int, str, int, str | None, str | int | None, str | None]


@dataclass(frozen=True)
class Request:
    params: DetokParams
    ids: list[int]
    vocab_size: int = 0  # Open.vocab_size: the engine's vocabulary size


def varied_requests(tokenizer, seed: int, ask_ids: bool = False) -> list[Request]:  # noqa: ANN001
    """Per request: params and output ids (real text, some random ids, an EOS or a bad id now and then); every third
    request's engine knows a vocabulary past the tokenizer's, with ids of it the tokenizer lacks (no text). With
    `ask_ids` every other request asks for its token ids (return_token_ids); the ids are the same either way."""
    rng = random.Random(seed)
    texts = list(load_texts().values())
    eos = sorted(tokenizer.eos_token_ids)
    vocab = tokenizer.vocab_size
    requests = []
    for index in range(24):
        ids = list(tokenizer.encode(rng.choice(texts)).ids)[: rng.randint(5, 120)]
        for _ in range(rng.randint(0, 4)):
            ids.insert(rng.randrange(len(ids) + 1), rng.randrange(vocab))
        model_vocab = vocab + 64 if index % 3 == 0 else 0
        for _ in range(rng.randint(1, 3) if model_vocab else 0):
            ids.insert(rng.randrange(len(ids) + 1), rng.randrange(vocab, model_vocab))
        if index % 5 == 0 and eos:
            ids.insert(rng.randrange(len(ids) + 1), eos[0])
        if index % 11 == 3:
            ids.insert(rng.randrange(len(ids) + 1), max(vocab, model_vocab) + 7)  # a bad id ends only this request
        ordinary = [ids[rng.randrange(len(ids))]] if index % 4 == 2 else []  # a stop token that is plain text
        params = DetokParams(
            stop=rng.sample(STOPS, rng.randint(0, 2)) if index % 3 else [],
            stop_token_ids=sorted(set(eos + ordinary) - set(range(vocab, model_vocab))),
            include_stop_str_in_output=index % 4 == 1,
            min_tokens=rng.choice([0, 0, 3]),
            return_token_ids=ask_ids and index % 2 == 0,
        )
        requests.append(Request(params, ids, model_vocab))
    return requests


def engine_batches(requests: list[Request], seed: int) -> list[TokenBatch]:
    """Rid r<index> per request: its Open first, then mostly one id per step, sometimes several; the last item of a
    request carries finish "length"."""
    rng = random.Random(seed)
    opens = [
        Open(f"r{index}", [], request.params, vocab_size=request.vocab_size) for index, request in enumerate(requests)
    ]
    batches = [token_batch(0, 0, opens, [])]
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
            items.append((f"r{index}", Tokens(ids[start:end], "length" if end == len(ids) else None)))
        batches.append(token_batch(step, 0, [], items))
    return batches


def with_extras(batches: list[TokenBatch]) -> list[TokenBatch]:
    """The same batches with every row, a usual one (one id, nothing else) too, as a row with extras."""
    out = []
    for batch in batches:
        rows = token_rows(batch)
        extras = {row: tokens for row, (_, tokens) in enumerate(rows)}
        out.append(TokenBatch(batch.step, batch.sent_ns, batch.opens, batch.rids, [0] * len(rows), extras))
    return out


def run_batches(state: WorkerState, batches: list[TokenBatch]) -> tuple[dict[str, list[Delta]], list[tuple]]:
    """Per rid its deltas in order, the Finishes sorted."""
    deltas: dict[str, list[Delta]] = {}
    finishes = []
    for batch in batches:
        result = state.handle_batch(batch)
        for d in text_deltas(result.text_batch):
            deltas.setdefault(d.rid, []).append((d.offset, d.text, d.n_tokens, d.finish, d.stop_reason, d.error))
        finishes += [(f.rid, f.reason, f.stop_reason) for f in result.finishes]
    return deltas, sorted(finishes)
