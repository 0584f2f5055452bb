"""The rows of TokenBatch and TextBatch (bus/columns.py): one row per item in order, extras only on the rows that
need them, the frame decoders refusing columns of different lengths or extras naming no row, the per-front split,
and a worker keeping a rid's deltas in order when one of its ids is held or takes the item path."""

from __future__ import annotations

from helpers.bus_rows import text_batch, token_rows
from helpers.fixtures import load_fixture_tokenizer

from detok_worker.bus.codec import BAD_SCHEMA, encode, front_decoder, worker_decoder
from detok_worker.bus.columns import split_text_batch, text_deltas, token_batch
from detok_worker.bus.messages import (
    DetokParams,
    Open,
    TextBatch,
    TextDelta,
    TextExtras,
    TokenBatch,
    TokenLogprob,
    Tokens,
)
from detok_worker.worker.endings import BAD_UNKNOWN_RID
from detok_worker.worker.state import WorkerState


def test_token_batch_keeps_every_item_in_order_with_extras_only_where_needed() -> None:
    items = [
        ("a", Tokens([1])),
        ("b", Tokens([2, 3])),
        ("b", Tokens([4])),
        ("c", Tokens([5], "length")),
        ("a", Tokens([6])),
        ("d", Tokens([7], None, None, [TokenLogprob(-0.5)])),
        ("e", Tokens([], "error", "boom")),
    ]
    batch = token_batch(3, 9, [], items)
    assert batch.rids == ["a", "b", "b", "c", "a", "d", "e"]
    assert batch.ids == [1, 0, 4, 0, 6, 0, 0]
    assert sorted(batch.extras) == [1, 3, 5, 6]
    assert token_rows(batch) == items
    decoded = worker_decoder().decode(encode(batch))
    assert decoded == batch


def test_frame_decoders_refuse_columns_of_different_lengths_and_extras_of_no_row() -> None:
    workers = worker_decoder()
    assert workers.decode(encode(TokenBatch(1, 0, [], ["a", "b"], [5]))) is None
    assert workers.decode(encode(TokenBatch(1, 0, [], ["a"], [5], {1: Tokens([6])}))) is None
    assert workers.decode(encode(TokenBatch(1, 0, [], ["a"], [5], {-1: Tokens([6])}))) is None
    assert workers.bad_frames == {BAD_SCHEMA: 3}
    fronts = front_decoder()
    assert fronts.decode(encode(TextBatch("w", 0, 1, ["a"], [0], ["x"], []))) is None
    assert fronts.decode(encode(TextBatch("w", 0, 1, ["a"], [0], ["x"], [1], {1: TextExtras(finish="stop")}))) is None
    assert fronts.bad_frames == {BAD_SCHEMA: 2}
    good = TextBatch("w", 0, 1, ["a", "b"], [0, 0], ["x", ""], [1, 1], {1: TextExtras(finish="stop")})
    assert fronts.decode(encode(good)) == good
    assert text_deltas(good) == [TextDelta("a", 0, "x", 1), TextDelta("b", 0, "", 1, finish="stop")]


def test_text_deltas_and_the_per_front_split_keep_the_order() -> None:
    deltas = [
        TextDelta("a", 0, "hi", 1),
        TextDelta("b", 0, "yo", 1),
        TextDelta("a", 2, "x", 2),
        TextDelta("a", 3, "!", 3, finish="stop"),
        TextDelta("c", 0, "", 0, finish="error", stop_reason=None, error="bad id"),
    ]
    batch = text_batch("w", 5, 7, deltas)
    assert (batch.rids, sorted(batch.extras)) == (["a", "b", "a", "a", "c"], [3, 4])
    assert text_deltas(batch) == deltas
    fronts = {"a": 1, "b": 0, "c": 2}
    parts = split_text_batch(batch, fronts.__getitem__)
    assert sorted(parts) == [0, 1, 2]
    for front, part in parts.items():
        assert (part.worker, part.sent_ns, part.step) == ("w", 5, 7)
        assert text_deltas(part) == [d for d in deltas if fronts[d.rid] == front]
    assert split_text_batch(TextBatch("w", 5, 7), fronts.__getitem__) == {}


def test_held_ids_keep_plain_text_plain_and_each_rids_order() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    emoji = tokenizer.encode("🪼").ids
    hello = tokenizer.encode(" hello").ids
    assert len(emoji) > 1 and len(hello) == 1
    state = WorkerState(tokenizer, "w")
    state.handle_batch(token_batch(0, 0, [Open("a", [], DetokParams()), Open("b", [], DetokParams())], []))
    # a: pieces of a character (held, then released by the decoder), then a whole word; b: a table lookup
    rids = ["a", "b", *["a"] * (len(emoji) - 1), "a", "nobody"]
    ids = [emoji[0], hello[0], *emoji[1:], hello[0], hello[0]]
    items = [*((rid, Tokens([token_id])) for rid, token_id in zip(rids, ids, strict=True)), ("a", Tokens([], "length"))]
    result = state.handle_batch(token_batch(1, 0, [], items)).text_batch
    assert [(d.rid, d.text, d.n_tokens, d.finish) for d in text_deltas(result)] == [
        ("b", " hello", 1, None),
        ("a", "🪼", len(emoji), None),
        ("a", " hello", len(emoji) + 1, None),
        ("a", "", len(emoji) + 1, "length"),
    ]
    assert list(result.extras) == [3]  # only the finish has extras
    assert "".join(d.text for d in text_deltas(result) if d.rid == "a") == tokenizer.decode([*emoji, *hello])
    assert state.bad[BAD_UNKNOWN_RID] == 1


def test_rows_with_extras_and_plain_rows_of_a_rid_keep_its_order() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    words = tokenizer.encode(" one two three four").ids
    assert len(words) == 4
    state = WorkerState(tokenizer, "w")
    state.handle_batch(token_batch(0, 0, [Open("a", [], DetokParams()), Open("b", [], DetokParams())], []))
    items = [
        ("a", Tokens(words[:2])),  # several ids: a row with extras
        ("a", Tokens(words[2:3])),  # one id: a plain row, after a's row with extras
        ("b", Tokens(words[:1], None, None, [TokenLogprob(-0.5)])),  # logprobs: a row with extras
        ("b", Tokens(words[1:2])),
        ("a", Tokens(words[3:4])),
    ]
    batch = token_batch(1, 0, [], items)
    assert sorted(batch.extras) == [0, 2]
    result = state.handle_batch(batch).text_batch
    assert [(d.rid, d.text) for d in text_deltas(result)] == [
        ("a", " one two"),
        ("a", " three"),
        ("b", " one"),
        ("b", " two"),
        ("a", " four"),
    ]
    assert sorted(result.extras) == [2]  # b's logprobs, on the delta of their token
