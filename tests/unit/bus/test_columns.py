"""The columnar parts of TokenBatch and TextBatch (bus/columns.py): the order rule (columns before items, per rid
order kept), the frame decoders refusing columns of different lengths, the per-front split, and a worker keeping a
rid's deltas in order when one of its column ids is held or goes to the items."""

from __future__ import annotations

from helpers.fixtures import load_fixture_tokenizer

from detok_worker.bus.codec import BAD_SCHEMA, encode, front_decoder, worker_decoder
from detok_worker.bus.columns import split_text_batch, text_deltas, token_batch, token_items
from detok_worker.bus.messages import DetokParams, Open, TextBatch, TextDelta, TokenBatch, TokenLogprob, Tokens
from detok_worker.worker.endings import BAD_UNKNOWN_RID
from detok_worker.worker.state import WorkerState


def _per_rid(items: list) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for item in items:
        grouped.setdefault(item.rid, []).append(item)
    return grouped


def test_token_batch_puts_usual_items_in_columns_and_keeps_each_rids_order() -> None:
    items = [
        Tokens("a", [1]),
        Tokens("b", [2, 3]),
        Tokens("b", [4]),  # after an item of b that stays an item: stays an item too
        Tokens("c", [5], "length"),
        Tokens("a", [6]),
        Tokens("d", [7], None, None, []),  # logprobs: an item
    ]
    batch = token_batch(3, 9, [], items)
    assert (batch.rids, batch.ids) == (["a", "a"], [1, 6])
    assert batch.items == [items[1], items[2], items[3], items[5]]
    assert _per_rid(token_items(batch)) == _per_rid(items)
    decoded = worker_decoder().decode(encode(batch))
    assert decoded == batch


def test_frame_decoders_refuse_columns_of_different_lengths() -> None:
    workers = worker_decoder()
    assert workers.decode(encode(TokenBatch(1, 0, [], [], ["a", "b"], [5]))) is None
    assert workers.bad_frames == {BAD_SCHEMA: 1}
    fronts = front_decoder()
    assert fronts.decode(encode(TextBatch("w", 0, 1, [], ["a"], [0], ["x"], []))) is None
    assert fronts.bad_frames == {BAD_SCHEMA: 1}
    good = TextBatch("w", 0, 1, [TextDelta("b", 0, "", 1, "stop")], ["a"], [0], ["x"], [1])
    assert fronts.decode(encode(good)) == good


def test_text_deltas_and_the_per_front_split_keep_the_order() -> None:
    batch = TextBatch(
        "w",
        5,
        7,
        [TextDelta("a", 3, "!", 3, "stop"), TextDelta("c", 0, "", 0, "error", None, "bad id")],
        ["a", "b", "a"],
        [0, 0, 2],
        ["hi", "yo", "x"],
        [1, 1, 2],
    )
    deltas = text_deltas(batch)
    assert [(d.rid, d.offset, d.text) for d in deltas] == [
        ("a", 0, "hi"),
        ("b", 0, "yo"),
        ("a", 2, "x"),
        ("a", 3, "!"),
        ("c", 0, ""),
    ]
    fronts = {"a": 1, "b": 0, "c": 2}
    parts = split_text_batch(batch, fronts.__getitem__)
    assert sorted(parts) == [0, 1, 2]
    for front, part in parts.items():
        assert (part.worker, part.sent_ns, part.step) == ("w", 5, 7)
        assert text_deltas(part) == [d for d in deltas if fronts[d.rid] == front]
    assert split_text_batch(TextBatch("w", 5, 7, []), fronts.__getitem__) == {0: TextBatch("w", 5, 7, [])}


def test_held_column_ids_keep_plain_text_in_columns_and_each_rids_order() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    emoji = tokenizer.encode("🪼").ids
    hello = tokenizer.encode(" hello").ids
    assert len(emoji) > 1 and len(hello) == 1
    state = WorkerState(tokenizer, "w")
    state.handle_batch(TokenBatch(0, 0, [Open("a", [], DetokParams()), Open("b", [], DetokParams())], []))
    # a: pieces of a character (held, then released by the decoder), then a whole word; b: a table lookup
    rids = ["a", "b", *["a"] * (len(emoji) - 1), "a", "nobody"]
    ids = [emoji[0], hello[0], *emoji[1:], hello[0], hello[0]]
    batch = TokenBatch(1, 0, [], [Tokens("a", [], "length")], rids, ids)
    result = state.handle_batch(batch).text_batch
    assert list(zip(result.rids, result.texts, result.n_tokens, strict=True)) == [
        ("b", " hello", 1),
        ("a", "🪼", len(emoji)),
        ("a", " hello", len(emoji) + 1),
    ]
    assert [(d.rid, d.text, d.n_tokens, d.finish) for d in result.items] == [("a", "", len(emoji) + 1, "length")]
    assert "".join(d.text for d in text_deltas(result) if d.rid == "a") == tokenizer.decode([*emoji, *hello])
    assert state.bad[BAD_UNKNOWN_RID] == 1


def test_after_a_rids_delta_in_items_its_plain_text_follows_in_items() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    words = tokenizer.encode(" one two three four").ids
    assert len(words) == 4
    state = WorkerState(tokenizer, "w")
    state.handle_batch(TokenBatch(0, 0, [Open("a", [], DetokParams()), Open("b", [], DetokParams())], []))
    items = [
        Tokens("a", words[:2]),  # several ids: a delta in items
        Tokens("a", words[2:3]),  # one id: plain text, but after a's delta in items
        Tokens("b", words[:1], None, None, [TokenLogprob(-0.5)]),  # logprobs: a delta in items
        Tokens("b", words[1:2]),
    ]
    batch = token_batch(1, 0, [], items)
    assert batch.rids == []  # both rids have an earlier item in items
    batch = TokenBatch(1, 0, [], items)  # the same items, handed over as items
    result = state.handle_batch(batch).text_batch
    assert result.rids == []
    assert [(d.rid, d.text) for d in result.items] == [("a", " one two"), ("a", " three"), ("b", " one"), ("b", " two")]
