"""A worker's Open plans (worker/open_plans.py): Opens with the same params share the checked stop settings but
never per-request state, a cached plan skips no check that depends on more than the params, and the cache stays
bounded with exact results."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, TokenBatch, Tokens
from detok_worker.worker.open_plans import OPEN_PLANS_CAPACITY
from detok_worker.worker.state import BAD_PARAMS, BAD_STOP_BUDGET, WorkerState

STOP = "</answer>"
HITS = "The result is 42</answer> and then more text"  # completes the stop string
MISSES = "a </ans and </an and </answer-like text, no stop"  # starts it again and again, never completes it


def _texts(state: WorkerState, batches: list[TokenBatch]) -> tuple[dict[str, str], dict[str, str | None]]:
    """Each rid's text (deltas joined by offset) and its finish, over these batches."""
    texts: dict[str, str] = {}
    finishes: dict[str, str | None] = {}
    for batch in batches:
        for delta in text_deltas(state.handle_batch(batch).text_batch):
            text = texts.get(delta.rid, "")
            texts[delta.rid] = text + delta.text[len(text) - delta.offset :]
            finishes[delta.rid] = delta.finish or finishes.get(delta.rid)
    return texts, finishes


def _interleaved(rid_ids: dict[str, list[int]], starts: dict[str, int], plain: bool) -> list[TokenBatch]:
    """One id per rid per step from the rid's start step on, as plain rows (the worker's hot loop) or as rows with
    extras (its item path); then a row with finish "length" for each rid."""
    steps = max(starts[rid] + len(ids) for rid, ids in rid_ids.items())
    batches = []
    for step in range(steps):
        pairs = [(rid, ids[step - starts[rid]]) for rid, ids in rid_ids.items() if 0 <= step - starts[rid] < len(ids)]
        if plain:
            batches.append(token_batch(step, 0, [], [(rid, Tokens([i])) for rid, i in pairs]))
        else:
            extras = {row: Tokens([i]) for row, (_, i) in enumerate(pairs)}
            batches.append(TokenBatch(step, 0, [], [rid for rid, _ in pairs], [0] * len(pairs), extras))
    batches.append(token_batch(steps, 0, [], [(rid, Tokens([], "length")) for rid in rid_ids]))
    return batches


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "extras"])
@pytest.mark.parametrize("include_stop", [False, True], ids=["hidden", "visible"])
@pytest.mark.parametrize("name", ["qwen3", "bert-wordpiece"])  # bert: no table, every id through the stream
def test_opens_with_the_same_params_keep_their_own_state(name, plain, include_stop):
    tokenizer = load_fixture_tokenizer(name)
    stop = tokenizer.decode(tokenizer.encode(STOP).ids, True)
    params = DetokParams(
        stop=[stop], stop_token_ids=sorted(tokenizer.eos_token_ids), include_stop_str_in_output=include_stop
    )
    state = WorkerState(tokenizer, "w")
    rid_ids = {"hits": tokenizer.encode(HITS).ids, "misses": tokenizer.encode(MISSES).ids}
    rid_ids["late"] = rid_ids["hits"]
    opens = token_batch(0, 0, [Open(rid, [], params) for rid in rid_ids], [])
    # "late" decodes HITS two steps after "hits": the two are in different stop-string states at every step
    texts, finishes = _texts(state, [opens, *_interleaved(rid_ids, {"hits": 0, "misses": 0, "late": 2}, plain)])
    assert len(state.open_plans) == 1  # the three Opens shared one plan
    hits, misses = (tokenizer.decode(rid_ids[rid], True) for rid in ("hits", "misses"))
    assert stop in hits and stop not in misses and stop[:3] in misses
    cut = hits.index(stop) + (len(stop) if include_stop else 0)
    assert texts == {"hits": hits[:cut], "misses": misses, "late": hits[:cut]}
    assert finishes == {"hits": "stop", "misses": "length", "late": "stop"}


def test_a_cached_plan_skips_no_check_beyond_the_params(qwen3):
    state = WorkerState(qwen3, "w", max_live_stop_chars=20)
    ids = qwen3.encode("hello").ids
    out_of_vocab = DetokParams(stop_token_ids=[qwen3.vocab_size + 5])
    errors = []
    for round_ in range(2):  # a refused Open is never kept as good: the second one is refused the same way
        result = state.handle_batch(token_batch(round_, 0, [Open(f"bad{round_}", [], out_of_vocab)], []))
        (delta,) = text_deltas(result.text_batch)
        assert delta.finish == "error"
        errors.append(delta.error)
    assert errors[0] == errors[1]
    assert f"stop token id {qwen3.vocab_size + 5} names no token" in errors[0]
    assert state.bad[BAD_PARAMS] == 2
    assert len(state.open_plans) == 0

    good = DetokParams(stop=["x" * 15], stop_token_ids=[1])
    for lookalike in ([True], [1.0]):  # equal to [1] in Python, refused by the stop rules: never a cached plan's
        state.handle_batch(token_batch(0, 0, [Open("first", [], good)], [("first", Tokens(ids, "length"))]))
        alike = DetokParams(stop=good.stop, stop_token_ids=lookalike)
        result = state.handle_batch(token_batch(0, 0, [Open("alike", [], alike)], []))
        (delta,) = text_deltas(result.text_batch)
        assert delta.finish == "error"
        assert delta.error == f"stop token id {lookalike[0]!r} is not a token id (an int >= 0)"
    # the live stop-chars budget is checked on every Open, plan or not: a second live rid would pass 20 characters
    opened = state.handle_batch(token_batch(1, 0, [Open("a", [], good), Open("b", [], good)], [("a", Tokens(ids))]))
    deltas = {delta.rid: delta for delta in text_deltas(opened.text_batch)}
    assert deltas["a"].text == "hello"
    assert deltas["b"].finish == "error"
    assert "worker.max_live_stop_chars = 20" in deltas["b"].error
    assert state.bad[BAD_STOP_BUDGET] == 1
    # a bad prompt id ends the rid every time, while the params' plan stays good for the next Open
    for rid in ("p1", "p2"):
        result = state.handle_batch(token_batch(2, 0, [Open(rid, [qwen3.vocab_size + 9], DetokParams())], []))
        (delta,) = text_deltas(result.text_batch)
        assert delta.finish == "error" and "cannot open request" in delta.error
    assert _texts(state, [token_batch(3, 0, [Open("ok", [], DetokParams())], [("ok", Tokens(ids))])])[0] == {
        "ok": "hello"
    }


def test_the_plans_stay_bounded_and_exact(qwen3):
    state = WorkerState(qwen3, "w")
    text = "one two three four five"
    ids = qwen3.encode(text).ids
    words = text.split()
    count = OPEN_PLANS_CAPACITY + 40
    for index in range(count):  # distinct params each time: stop strings of the index, one of them in the text
        stop = [f"<{index}>", words[index % len(words)]]
        rid = f"r{index}"
        texts, _ = _texts(state, [token_batch(index, 0, [Open(rid, [], DetokParams(stop=stop))], [(rid, Tokens(ids))])])
        assert texts[rid] == text[: text.index(stop[1])]
        assert len(state.open_plans) == min(index + 1, OPEN_PLANS_CAPACITY)
    again = DetokParams(stop=["<0>", words[0]])  # dropped long ago: planned again, the same result
    texts, _ = _texts(state, [token_batch(count, 0, [Open("again", [], again)], [("again", Tokens(ids))])])
    assert texts == {"again": ""}
    assert len(state.open_plans) == OPEN_PLANS_CAPACITY
