"""The worker's lane (StopSequenceDecoder.lane, stepped inline by WorkerState.handle_batch) changes nothing a
front sees: every delta and Finish equals what the same batches give with the lane turned off (each id through
process_one/process_tokens), on byte-level and byte-fallback tables, for emoji, CJK, byte tokens and random ids,
with stop strings, stop tokens, min_tokens, several ids per item, the engine's finish and ids the tokenizer lacks
that the engine's model can emit."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.worker_batches import Delta, columnar, engine_batches, run_batches, varied_requests

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, TokenBatch, Tokens
from detok_worker.stream import StopSequenceConfig, StopSequenceDecoder
from detok_worker.stream.stop.decoder import StopSequenceDecoder as Decoder
from detok_worker.worker.state import WorkerState


def _run(tokenizer, batches: list[TokenBatch]) -> tuple[dict[str, list[Delta]], list[tuple], int, int]:
    """Per rid its deltas in order, the Finishes, the tokens consumed and the ids without text counted."""
    state = WorkerState(tokenizer, "w")
    deltas, finishes = run_batches(state, batches)
    return deltas, finishes, state.tokens_consumed, state.unknown_ids


@pytest.mark.parametrize("family", ["qwen3", "mistral-sp-v1", "gpt4o"])
def test_the_lane_changes_nothing_a_front_sees(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = load_fixture_tokenizer(family)
    batches = engine_batches(varied_requests(tokenizer, seed=16), seed=61)
    columns = columnar(batches)
    assert sum(len(batch.rids) for batch in columns) > 5 * sum(len(batch.items) for batch in columns)
    with_lane = _run(tokenizer, columns)
    items_only = _run(tokenizer, batches)
    monkeypatch.setattr(Decoder, "lane", lambda self: None)
    without_lane = _run(tokenizer, columns)
    monkeypatch.undo()
    warm = _run(tokenizer, columns)  # the shared memos now hold every byte step and scan, matches included
    assert with_lane == items_only == without_lane == warm
    deltas, finishes, _, unknown_ids = with_lane
    ends = [rid_deltas[-1] for rid_deltas in deltas.values()]
    assert sum(1 for end in ends if end[3] == "stop") >= 3  # stop strings and stop tokens were reached
    assert any(end[5] for end in ends)  # and a bad id ended its request
    assert unknown_ids >= 8  # and ids the tokenizer lacks went by as tokens without text


def test_a_memoised_stop_string_match_stops_a_rid_on_its_lane() -> None:
    """The second rid meets a stop string whose scan the first one memoised: the lane must not step over it."""
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("so we went to the end of the road").ids
    params = DetokParams(stop=["the end"])
    state = WorkerState(tokenizer, "w")
    texts: dict[str, str] = {}
    for rid in ("a", "b"):
        batches = [TokenBatch(0, 0, [Open(rid, [], params)], [])]
        batches += [token_batch(step, 0, [], [Tokens(rid, [token_id])]) for step, token_id in enumerate(ids, 1)]
        for batch in batches:
            for delta in text_deltas(state.handle_batch(batch).text_batch):
                texts[rid] = texts.get(rid, "") + delta.text
                assert delta.finish is None or delta.stop_reason == "the end"
    assert texts == {"a": "so we went to ", "b": "so we went to "}


def test_lane_is_offered_only_where_a_lookup_is_exact() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_sequences=("the end",)))
    lane = decoder.lane()
    assert lane is not None
    texts, stop_tokens, passthrough, memo, pending, scan = lane
    hello = tokenizer.encode("Hello").ids[0]
    assert texts[hello] == "Hello" and passthrough is not None and memo is not None and pending == b""
    emoji = tokenizer.encode("🪼").ids
    assert len(emoji) > 1 and texts[emoji[0]] is None  # a piece of a character is never in the table
    decoder.process_tokens(emoji[:1])
    lane = decoder.lane()  # bytes of an unfinished character are pending: the memo stands for step()
    assert lane is not None
    _, _, _, memo, pending, _ = lane
    assert pending == "🪼".encode()[: len(pending)] and 0 < len(pending) < 4
    assert memo is not None and memo[(b"", emoji[0])] == ("", pending)  # the step that got there is memoised
    decoder.process_tokens(emoji[1:])
    assert decoder.lane() is not None
    decoder.process_tokens(tokenizer.encode(" the").ids)
    assert decoder.held_text == "the"  # a possible stop string is held back: only memoised scans step on
    lane = decoder.lane()
    assert lane is not None
    _, _, passthrough, _, _, scan = lane
    assert passthrough == {""} and scan is not None and scan[2] != 0  # (memo, root passthrough, state)
    decoder.process_tokens(tokenizer.encode(" end").ids)
    assert decoder.stopped and decoder.lane() is None


def test_no_lane_while_the_pending_character_is_the_prompts() -> None:
    """A prompt that ends inside a character owes that character: step() drops it, a memo lookup would not."""
    tokenizer = load_fixture_tokenizer("qwen3")
    emoji = tokenizer.encode("🪼").ids
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(), prompt_ids=emoji[:1])
    assert decoder.lane() is None
    assert decoder.process_tokens(emoji[1:]).text == ""  # the character is the prompt's
    assert decoder.lane() is not None


def test_sync_lane_gives_the_stream_its_pending_bytes() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("水🪼").ids
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig())
    first = decoder.process_tokens(ids[:1])
    lane = decoder.lane()
    assert lane is not None
    pending = "🪼".encode()[:2]
    decoder.sync_lane(1, (*lane[:4], pending, *lane[5:]))  # as if the lane had stepped to two bytes of the jellyfish
    assert first.text + decoder.process_tokens(tokenizer.encode("x").ids).text == "水\ufffdx"


def test_sync_lane_counts_lane_steps_for_min_tokens() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    eos = min(tokenizer.eos_token_ids)
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_tokens=(eos,)), min_tokens=3)
    ids = tokenizer.encode(" one two three").ids
    lane = decoder.lane()
    assert len(ids) == 3 and lane is not None
    decoder.sync_lane(3, lane)  # three ids stepped by the lane: min_tokens is met, so EOS stops
    assert decoder.process_tokens([eos]).stopped
    with pytest.raises(ValueError, match="already processed"):
        decoder.sync_lane(2, lane)
