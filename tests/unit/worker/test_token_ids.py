"""return_token_ids in the worker: a rid whose DetokParams ask for its token ids gets, on each delta, the ids of the
tokens consumed since its previous delta (held ones ride on the next delta, as logprobs do), always as an item,
never in the columns; its text is exactly what it would be without them. Rids that do not ask keep the columns,
with the same deltas as when no rid asks."""

from __future__ import annotations

import msgspec
import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.worker_batches import Delta, engine_batches, varied_requests, with_extras

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, TextBatch, TokenBatch, Tokens
from detok_worker.front.request_stream import RequestStream
from detok_worker.stream.stop.rules import StopLimits, StopRules
from detok_worker.worker.state import WorkerState


def _run(tokenizer, batches: list[TokenBatch]) -> tuple[dict[str, list[Delta]], list[tuple], list[TextBatch]]:
    """As run_batches (per rid its deltas, the Finishes sorted), plus every TextBatch the worker sent."""
    state = WorkerState(tokenizer, "w")
    deltas: dict[str, list[Delta]] = {}
    finishes = []
    sent = []
    for batch in batches:
        result = state.handle_batch(batch)
        sent.append(result.text_batch)
        for d in text_deltas(result.text_batch):
            deltas.setdefault(d.rid, []).append((d.offset, d.text, d.n_tokens, d.finish, d.stop_reason, d.error))
        finishes += [(f.rid, f.reason, f.stop_reason) for f in result.finishes]
    return deltas, sorted(finishes), sent


@pytest.mark.parametrize("family", ["qwen3", "mistral-sp-v1", "gpt4o"])
@pytest.mark.parametrize("columns", [True, False])
def test_each_delta_carries_the_ids_it_consumed_and_the_text_is_unchanged(family: str, columns: bool) -> None:
    tokenizer = load_fixture_tokenizer(family)
    requests = varied_requests(tokenizer, seed=7, ask_ids=True)
    batches = engine_batches(requests, seed=70)
    batches = batches if columns else with_extras(batches)
    deltas, finishes, sent = _run(tokenizer, batches)
    plain = engine_batches(varied_requests(tokenizer, seed=7), seed=70)
    plain_deltas, plain_finishes, _ = _run(tokenizer, plain if columns else with_extras(plain))
    assert (deltas, finishes) == (plain_deltas, plain_finishes)  # the same text, offsets, counts and endings

    asked = {f"r{index}" for index, request in enumerate(requests) if request.params.return_token_ids}
    ids_by_rid: dict[str, list[int]] = {}
    for text_batch in sent:
        assert all(text_batch.rids[row] in asked for row in text_batch.extras if text_batch.extras[row].token_ids)
        assert all(row in text_batch.extras for row, rid in enumerate(text_batch.rids) if rid in asked)  # ids ride
        for delta in text_deltas(text_batch):
            if delta.rid not in asked:
                assert delta.token_ids is None
                continue
            ids = ids_by_rid.setdefault(delta.rid, [])
            assert delta.token_ids is not None
            assert len(ids) + len(delta.token_ids) == delta.n_tokens  # the tokens since the previous delta
            ids += delta.token_ids
    ended_with_stop = 0
    for rid in asked:
        request = requests[int(rid[1:])]
        consumed = deltas[rid][-1][2]
        assert ids_by_rid[rid] == request.ids[:consumed]  # every consumed id once, in order: a stop token counts
        ended_with_stop += deltas[rid][-1][3] == "stop"
    assert ended_with_stop >= 2
    if columns:  # the other rids' deltas are mostly plain rows
        assert sum(len(text_batch.rids) - len(text_batch.extras) for text_batch in sent) > 100


def test_rids_that_do_not_ask_stay_in_the_columns() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode(" Hello there, how are you today?").ids
    state = WorkerState(tokenizer, "w")
    opens = [Open("plain", [], DetokParams()), Open("ids", [], DetokParams(return_token_ids=True))]
    state.handle_batch(token_batch(0, 0, opens, []))
    assert state.live["plain"].plain and not state.live["ids"].plain
    for step, token_id in enumerate(ids, 1):
        batch = token_batch(step, 0, [], [("plain", Tokens([token_id])), ("ids", Tokens([token_id]))])
        assert not batch.extras
        text_batch = state.handle_batch(batch).text_batch
        assert text_batch.rids == ["plain", "ids"]
        assert list(text_batch.extras) == [1]  # the plain rid's row has no extras
        assert [(d.rid, d.token_ids) for d in text_deltas(text_batch)] == [("plain", None), ("ids", [token_id])]
        assert state.live["plain"].plain and not state.live["ids"].plain
        assert state.live["ids"].held_ids == []


def test_held_ids_ride_on_the_next_delta() -> None:
    """A character split across tokens holds the text back: the ids of its pieces wait for the delta that completes
    it; a stop token's id rides on the final delta."""
    tokenizer = load_fixture_tokenizer("qwen3")
    a, b = tokenizer.encode("a").ids, tokenizer.encode("b").ids
    jellyfish = tokenizer.encode("🪼").ids
    eos = min(tokenizer.eos_token_ids)
    assert len(jellyfish) > 1
    params = DetokParams(stop_token_ids=[eos], return_token_ids=True)
    state = WorkerState(tokenizer, "w")
    state.handle_batch(token_batch(0, 0, [Open("r", [], params)], []))
    got: list[tuple[str, list[int] | None]] = []
    for step, token_id in enumerate([*a, *jellyfish, *b, eos, *a], 1):
        text_batch = state.handle_batch(token_batch(step, 0, [], [("r", Tokens([token_id]))])).text_batch
        got += [(d.text, d.token_ids) for d in text_deltas(text_batch)]
    assert got == [("a", a), ("🪼", jellyfish), ("b", b), ("", [eos])]  # the id after EOS is not consumed
    assert "r" not in state.live


def test_a_reopen_replays_the_ids_and_the_front_keeps_each_once() -> None:
    """The engine re-opens the rid on another worker with its whole history: the new worker sends every id from
    token 0 again; the front's reassembly (by token index, as for logprobs) drops those it has."""
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("One, two, three: 今天的天气很好 and more").ids
    params = DetokParams(return_token_ids=True)
    rules = StopRules.from_params(params, StopLimits())
    stream = RequestStream("r", prompt_tokens=0, deadline=1e18, stop_rules=rules)
    first = WorkerState(tokenizer, "a")
    first.handle_batch(token_batch(0, 0, [Open("r", [], params)], []))
    for step, token_id in enumerate(ids[:6], 1):
        for delta in text_deltas(first.handle_batch(token_batch(step, 0, [], [("r", Tokens([token_id]))])).text_batch):
            assert stream.accept(msgspec.msgpack.decode(msgspec.msgpack.encode(delta), type=type(delta))) is not None
    taken = stream.take_token_ids()
    assert taken == ids[:6]
    second = WorkerState(tokenizer, "b")  # the first died; its rid moves here with the history
    batch = token_batch(7, 0, [Open("r", [], params)], [("r", Tokens(ids, "length"))])
    for delta in text_deltas(second.handle_batch(batch).text_batch):
        assert delta.token_ids is not None and delta.token_ids[:6] == taken  # re-sent from token 0
        assert stream.accept(delta) is not None
    assert taken + stream.take_token_ids() == ids
    assert stream.token_id_entries.delivered == len(ids) == stream.n_tokens and stream.failure is None
