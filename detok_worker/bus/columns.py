"""The rows of TokenBatch and TextBatch (bus/messages.py): one row per item, in order, as flat columns (msgpack
encodes and decodes flat lists several times faster than a struct per item, and the hot loops read them without
making a struct); the rare row with more than one id in or plain text out has its extras in a map by row index.
A receiver walks the rows in order: row_runs gives the runs of plain rows between the rows with extras.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import msgspec

from detok_worker.bus.messages import Open, TextBatch, TextDelta, TextExtras, TokenBatch, Tokens

MISMATCHED_COLUMNS = "the batch's columns have different lengths, or an extra names no row"
EXTRAS = TextExtras.__struct_fields__


TokenRow = tuple[str, Tokens]
"""One row of a TokenBatch as the engine plans it: the rid and its Tokens."""


def token_batch(step: int, sent_ns: int, opens: list[Open], rows: Sequence[TokenRow]) -> TokenBatch:
    """A TokenBatch of these rows, in this order: a plain one (one id, nothing else) as its id in `ids`, any other
    with its Tokens in `extras`."""
    rids: list[str] = []
    ids: list[int] = []
    extras: dict[int, Tokens] = {}
    for rid, tokens in rows:
        if len(tokens.ids) == 1 and tokens.finish is None and tokens.error is None and tokens.logprobs is None:
            ids.append(tokens.ids[0])
        else:
            extras[len(rids)] = tokens
            ids.append(0)
        rids.append(rid)
    return TokenBatch(step, sent_ns, opens, rids, ids, extras)


def columns_ok(message: object) -> bool:
    """False for a batch whose columns differ in length or whose extras name a row it lacks (the frame decoder
    counts it as a bad frame)."""
    if isinstance(message, TokenBatch):
        count = len(message.rids)
        return len(message.ids) == count and _rows_exist(message.extras, count)
    if isinstance(message, TextBatch):
        count = len(message.rids)
        columns = (message.offsets, message.texts, message.n_tokens)
        return all(len(column) == count for column in columns) and _rows_exist(message.extras, count)
    return True


def _rows_exist(extras: dict[int, object], count: int) -> bool:
    return not extras or (min(extras) >= 0 and max(extras) < count)


def row_runs(start: int, end: int, extras: dict[int, object]) -> Iterator[tuple[int, int]]:
    """Rows start..end-1 as runs [first, last) of plain rows; each run is followed by row `last`, which has extras,
    unless last == end."""
    if extras:
        for row in sorted(row for row in extras if start <= row < end):
            yield start, row
            start = row + 1
    yield start, end


def add_delta(batch: TextBatch, delta: TextDelta) -> None:
    """The delta as the batch's next row (its extras, if any, under that row)."""
    extras = {name: getattr(delta, name) for name in EXTRAS}
    if any(value is not None for value in extras.values()):
        batch.extras[len(batch.rids)] = TextExtras(**extras)
    batch.rids.append(delta.rid)
    batch.offsets.append(delta.offset)
    batch.texts.append(delta.text)
    batch.n_tokens.append(delta.n_tokens)


def text_row(batch: TextBatch, row: int) -> TextDelta:
    """Row `row` of the batch as a TextDelta."""
    extras = batch.extras.get(row)
    fields = msgspec.structs.asdict(extras) if extras is not None else {}
    return TextDelta(batch.rids[row], batch.offsets[row], batch.texts[row], batch.n_tokens[row], **fields)


def text_deltas(batch: TextBatch) -> list[TextDelta]:
    """Every row of the batch as a TextDelta, in order."""
    columns = zip(batch.rids, batch.offsets, batch.texts, batch.n_tokens, strict=True)
    deltas = [TextDelta(rid, offset, text, n_tokens) for rid, offset, text, n_tokens in columns]
    for row in batch.extras:
        deltas[row] = text_row(batch, row)
    return deltas


def split_text_batch(batch: TextBatch, destination: Callable[[str], int]) -> dict[int, TextBatch]:
    """The batch cut into one TextBatch per destination(rid) with rows, each keeping the batch's order."""
    parts: dict[int, TextBatch] = {}
    extras = batch.extras
    columns = zip(batch.rids, batch.offsets, batch.texts, batch.n_tokens, strict=True)
    for row, (rid, offset, text, n_tokens) in enumerate(columns):
        key = destination(rid)
        part = parts.get(key)
        if part is None:
            part = parts[key] = TextBatch(batch.worker, batch.sent_ns, batch.step)
        extra = extras.get(row)
        if extra is not None:
            part.extras[len(part.rids)] = extra
        part.rids.append(rid)
        part.offsets.append(offset)
        part.texts.append(text)
        part.n_tokens.append(n_tokens)
    return parts
