"""The columnar parts of TokenBatch and TextBatch (bus/messages.py): the usual per-step item (one id in, plain text
out) travels as flat lists, which msgpack encodes and decodes several times faster than a struct per item, and
the worker's hot loop reads without touching a struct.

Order rule (one place): a receiver takes a batch's columns before its `items`. So a rid's usual item goes to the
columns only while none of its earlier items stayed in `items`; a worker never emits a rid's plain delta after one
of its `items` deltas in the same batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from detok_worker.bus.messages import Open, TextBatch, TextDelta, TokenBatch, Tokens

MISMATCHED_COLUMNS = "the batch's columns have different lengths"


def token_batch(
    step: int, sent_ns: int, opens: list[Open], items: Sequence[Tokens], columns: bool = True
) -> TokenBatch:
    """A TokenBatch of these items, in this order, with the usual ones (one id, nothing else) in the columns
    (`columns` False: all as items, for a worker that does not read columns: one older than them ignores them)."""
    if not columns:
        return TokenBatch(step, sent_ns, opens, list(items))
    rids: list[str] = []
    ids: list[int] = []
    rest: list[Tokens] = []
    in_rest: set[str] = set()
    for item in items:
        if (
            len(item.ids) == 1
            and item.finish is None
            and item.error is None
            and item.logprobs is None
            and item.rid not in in_rest
        ):
            rids.append(item.rid)
            ids.append(item.ids[0])
        else:
            rest.append(item)
            in_rest.add(item.rid)
    return TokenBatch(step, sent_ns, opens, rest, rids, ids)


def token_items(batch: TokenBatch) -> list[Tokens]:
    """Every item of the batch as a Tokens, in the order a worker takes them (columns first)."""
    return [Tokens(rid, [token_id]) for rid, token_id in zip(batch.rids, batch.ids, strict=True)] + batch.items


def columns_ok(message: object) -> bool:
    """False for a batch whose columns differ in length (the frame decoder counts it as a bad frame)."""
    if isinstance(message, TokenBatch):
        return len(message.rids) == len(message.ids)
    if isinstance(message, TextBatch):
        count = len(message.rids)
        return len(message.offsets) == count and len(message.texts) == count and len(message.n_tokens) == count
    return True


def text_deltas(batch: TextBatch) -> list[TextDelta]:
    """Every delta of the batch as a TextDelta, in the order a receiver takes them (columns first)."""
    columns = zip(batch.rids, batch.offsets, batch.texts, batch.n_tokens, strict=True)
    return [TextDelta(rid, offset, text, n_tokens) for rid, offset, text, n_tokens in columns] + batch.items


def has_text(batch: TextBatch) -> bool:
    return bool(batch.rids or batch.items)


def split_text_batch(batch: TextBatch, destination: Callable[[str], int]) -> dict[int, TextBatch]:
    """The batch cut into one TextBatch per destination(rid), each keeping the batch's order; destination 0 always
    gets one (an empty batch still reports the step)."""
    parts: dict[int, TextBatch] = {0: TextBatch(batch.worker, batch.sent_ns, batch.step, [])}

    def part_for(rid: str) -> TextBatch:
        key = destination(rid)
        part = parts.get(key)
        if part is None:
            part = parts[key] = TextBatch(batch.worker, batch.sent_ns, batch.step, [])
        return part

    columns = zip(batch.rids, batch.offsets, batch.texts, batch.n_tokens, strict=True)
    for rid, offset, text, n_tokens in columns:
        part = part_for(rid)
        part.rids.append(rid)
        part.offsets.append(offset)
        part.texts.append(text)
        part.n_tokens.append(n_tokens)
    for delta in batch.items:
        part_for(delta.rid).items.append(delta)
    return parts
