"""The first branch of StopSequenceDecoder.process_one (a table lookup, no call: what the worker's columns take
for the usual id) changes nothing a front sees: every delta and Finish equals what the same batches give as items
(process_tokens) and with that branch turned off (every id through _step_one), on byte-level and byte-fallback
tables, for emoji, CJK, byte tokens and random ids, with stop strings, stop tokens, min_tokens, several ids per
item, the engine's finish and ids the tokenizer lacks that the engine's model can emit."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.worker_batches import Delta, engine_batches, run_batches, varied_requests, with_extras

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
def test_the_first_branch_changes_nothing_a_front_sees(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = load_fixture_tokenizer(family)
    batches = engine_batches(varied_requests(tokenizer, seed=16), seed=61)
    assert sum(len(batch.rids) for batch in batches) > 6 * sum(len(batch.extras) for batch in batches)
    with_lookups = _run(tokenizer, batches)
    items_only = _run(tokenizer, with_extras(batches))

    def no_lookups(self: Decoder) -> None:
        self._texts = self._memo = self._memo_stream = None

    monkeypatch.setattr(Decoder, "_renew_lookups", no_lookups)
    without_lookups = _run(tokenizer, batches)
    monkeypatch.undo()
    warm = _run(tokenizer, batches)  # the shared memos now hold every byte step and scan, matches included
    assert with_lookups == items_only == without_lookups == warm
    deltas, finishes, _, unknown_ids = with_lookups
    ends = [rid_deltas[-1] for rid_deltas in deltas.values()]
    assert sum(1 for end in ends if end[3] == "stop") >= 3  # stop strings and stop tokens were reached
    assert any(end[5] for end in ends)  # and a bad id ended its request
    assert unknown_ids >= 8  # and ids the tokenizer lacks went by as tokens without text


def test_a_memoised_stop_string_match_stops_a_rid() -> None:
    """The second rid meets a stop string whose scan the first one memoised: no lookup may step over it."""
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("so we went to the end of the road").ids
    params = DetokParams(stop=["the end"])
    state = WorkerState(tokenizer, "w")
    texts: dict[str, str] = {}
    for rid in ("a", "b"):
        batches = [token_batch(0, 0, [Open(rid, [], params)], [])]
        batches += [token_batch(step, 0, [], [(rid, Tokens([token_id]))]) for step, token_id in enumerate(ids, 1)]
        for batch in batches:
            for delta in text_deltas(state.handle_batch(batch).text_batch):
                texts[rid] = texts.get(rid, "") + delta.text
                assert delta.finish is None or delta.stop_reason == "the end"
    assert texts == {"a": "so we went to ", "b": "so we went to "}


def test_lookups_stand_for_the_stream_and_the_stop_strings_only_where_exact() -> None:
    """The first branch (the table, at the stop strings' root) while nothing is pending; the memos of byte steps and
    of scans past it; nothing once stopped."""
    tokenizer = load_fixture_tokenizer("qwen3")
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_sequences=("the end",)))
    texts = decoder._texts
    hello = tokenizer.encode("Hello").ids[0]
    assert texts is not None and texts[hello] == "Hello" and decoder._memo is not None
    assert decoder.process_one(hello) == "Hello"
    emoji = tokenizer.encode("🪼").ids
    assert len(emoji) > 1 and texts[emoji[0]] is None  # a piece of a character is never in the table
    assert decoder.process_one(emoji[0]) == ""
    stream = decoder._memo_stream
    assert stream is not None and 0 < len(stream.pending) < 4 and decoder._texts is None  # bytes pending
    assert decoder._memo[(b"", emoji[0])] == ("", stream.pending)  # the step that got there is memoised
    assert "".join(decoder.process_one(token_id) for token_id in emoji[1:]) == "🪼"  # type: ignore[misc]
    assert stream.pending == b"" and decoder._texts is texts
    for token_id in tokenizer.encode(" the").ids:
        decoder.process_one(token_id)
    assert decoder.held_text == "the" and decoder._texts is None  # a possible stop string: past the first branch
    result = decoder.process_one(tokenizer.encode(" end").ids[0])
    assert decoder.stopped and not isinstance(result, str) and decoder._texts is decoder._table is None


@pytest.mark.parametrize("skip", [False, True])
def test_a_stop_token_never_takes_the_lookups(skip: bool) -> None:
    """A kept special stop token has text in the table, a skipped one none: either way it stops, min_tokens
    apart."""
    tokenizer = load_fixture_tokenizer("qwen3")
    im_end, hello = tokenizer.token_to_id("<|im_end|>"), tokenizer.encode("Hello").ids[0]
    decoder = StopSequenceDecoder(
        tokenizer, StopSequenceConfig(stop_tokens=(im_end,)), skip_special_tokens=skip, min_tokens=1
    )
    assert decoder._texts is not None and (decoder._texts[im_end] is None) == skip
    early = decoder.process_one(im_end)  # inside min_tokens: a plain token, its text kept or skipped
    assert not isinstance(early, str) and not early.stopped and early.text == ("" if skip else "<|im_end|>")
    assert decoder.process_one(hello) == "Hello"
    result = decoder.process_one(im_end)
    assert not isinstance(result, str) and result.stopped and result.text == "" and decoder._texts is None


def test_memo_steps_leave_the_same_state_as_calls() -> None:
    """A second decoder steps the same ids by the memos the first one filled: same text, pending bytes, stop
    state and count as the first, whose steps were calls of the stream and the filter."""
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("水🪼 the 🪼end 水 the e").ids
    config = StopSequenceConfig(stop_sequences=("the end",))
    first, second = (StopSequenceDecoder(tokenizer, config) for _ in range(2))
    for token_id in ids:
        assert first.process_one(token_id) == second.process_one(token_id)
        assert first._memo_stream.pending == second._memo_stream.pending  # type: ignore[union-attr]
        assert first.held_text == second.held_text and first.num_generated == second.num_generated
    assert first.held_text == "the e" and first.flush() == second.flush()


def test_no_lookup_while_the_pending_character_is_the_prompts() -> None:
    """A prompt that ends inside a character owes that character: step() drops it, a lookup would not."""
    tokenizer = load_fixture_tokenizer("qwen3")
    emoji = tokenizer.encode("🪼").ids
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(), prompt_ids=emoji[:1])
    assert decoder._texts is None
    assert all(decoder.process_one(token_id) == "" for token_id in emoji[1:])  # the character is the prompt's
    assert decoder._texts is not None


def test_ids_stepped_by_the_first_branch_count_for_min_tokens() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    eos = min(tokenizer.eos_token_ids)
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig(stop_tokens=(eos,)), min_tokens=3)
    ids = tokenizer.encode(" one two three").ids
    assert len(ids) == 3 and [decoder.process_one(token_id) for token_id in ids] == [" one", " two", " three"]
    assert decoder._texts is not None and decoder.num_generated == 3
    result = decoder.process_one(eos)
    assert not isinstance(result, str) and result.stopped  # min_tokens is met, so EOS stops


def test_process_one_and_process_tokens_interleave() -> None:
    """process_tokens leaves the first branch off until process_one renews it: the stream's pending bytes are its
    own, so either call continues the other's text."""
    tokenizer = load_fixture_tokenizer("qwen3")
    ids = tokenizer.encode("水🪼x 水🪼y").ids
    decoder = StopSequenceDecoder(tokenizer, StopSequenceConfig())
    texts = []
    for index, token_id in enumerate(ids):
        if index % 2:
            texts.append(decoder.process_tokens([token_id]).text)
        else:
            texts.append(decoder.process_one(token_id))  # type: ignore[arg-type]
    assert "".join(texts) == "水🪼x 水🪼y"
