"""Batches row by row, as tests build and read them: the rows of a TokenBatch as the engine planned them, and a
TextBatch made of whole deltas."""

from __future__ import annotations

from collections.abc import Sequence

from detok_worker.bus.columns import TokenRow, add_delta
from detok_worker.bus.messages import TextBatch, TextDelta, TokenBatch, Tokens


def token_rows(batch: TokenBatch) -> list[TokenRow]:
    """Every row of the batch as (rid, Tokens), in order."""
    rows: list[TokenRow] = []
    for row, (rid, token_id) in enumerate(zip(batch.rids, batch.ids, strict=True)):
        tokens = batch.extras.get(row)
        rows.append((rid, Tokens([token_id]) if tokens is None else tokens))
    return rows


def text_batch(worker: str, sent_ns: int, step: int, deltas: Sequence[TextDelta]) -> TextBatch:
    """A TextBatch of these deltas, one row each, in this order."""
    batch = TextBatch(worker, sent_ns, step)
    for delta in deltas:
        add_delta(batch, delta)
    return batch
