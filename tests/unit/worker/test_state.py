"""WorkerState, the pure per-rid logic of a worker: TokenBatch in, TextBatch (+ Finish) out."""

from __future__ import annotations

import pytest

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Finish, Open, TextDelta, Tokens
from detok_worker.stream.stop.rules import StopLimits
from detok_worker.worker.endings import BAD_UNKNOWN_RID
from detok_worker.worker.state import BAD_PARAMS, BAD_STOP_BUDGET, RECENTLY_ENDED_CAPACITY, WorkerState

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Family: 👨‍👩‍👧‍👦, flags 🇯🇵🇧🇷, skin tones 👍🏽👍🏿, and a jellyfish 🪼.",
    "今天的天气很好。東京の朝は早い。오늘 아침에는 비가 조금 내렸다.",
    "def f(x):\n    return x ** 2  # ثم العربية و ภาษาไทย",
]


def _eos(tokenizer) -> int:
    return min(tokenizer.eos_token_ids)


class Harness:
    """Feeds TokenBatches and keeps what a front would see."""

    def __init__(self, tokenizer, **limits: StopLimits | int) -> None:
        self.state = WorkerState(tokenizer, "w-test", **limits)
        self.step = 0
        self.deltas: dict[str, list[TextDelta]] = {}
        self.finishes: list[Finish] = []

    def feed(self, opens: list[Open], items: list[Tokens]) -> list[TextDelta]:
        self.step += 1
        result = self.state.handle_batch(token_batch(self.step, 1000 + self.step, opens, items))
        assert result.text_batch.step == self.step
        assert result.text_batch.sent_ns == 1000 + self.step
        assert result.text_batch.worker == "w-test"
        for delta in text_deltas(result.text_batch):
            self.deltas.setdefault(delta.rid, []).append(delta)
        self.finishes.extend(result.finishes)
        return list(text_deltas(result.text_batch))

    def text(self, rid: str) -> str:
        """The client's view: deltas joined by offset (re-sent text dropped)."""
        text = ""
        for delta in self.deltas.get(rid, []):
            assert delta.offset <= len(text), "a delta skipped text"
            text += delta.text[len(text) - delta.offset :]
        return text

    def last(self, rid: str) -> TextDelta:
        return self.deltas[rid][-1]


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def test_interleaved_rids_stream_exact_text(fixture_tokenizer):
    tokenizer = fixture_tokenizer
    harness = Harness(tokenizer)
    ids = {f"r{i}": tokenizer.encode(text).ids for i, text in enumerate(TEXTS)}
    chunked = {rid: _chunks(seq, 1 + i % 3) for i, (rid, seq) in enumerate(ids.items())}
    params = DetokParams(skip_special_tokens=False)
    opens = [Open(rid, [], params) for rid in ids]
    for step in range(max(len(c) for c in chunked.values())):
        items = [
            (rid, Tokens(chunks[step], "length" if step == len(chunks) - 1 else None))
            for rid, chunks in chunked.items()
            if step < len(chunks)
        ]
        harness.feed(opens if step == 0 else [], items)
    for rid, seq in ids.items():
        assert harness.text(rid) == tokenizer.decode(seq)
        deltas = harness.deltas[rid]
        assert [d.offset for d in deltas] == [sum(len(x.text) for x in deltas[:k]) for k in range(len(deltas))]
        assert deltas[-1].finish == "length" and deltas[-1].n_tokens == len(seq)
        assert all(d.finish is None for d in deltas[:-1])
        assert [d.n_tokens for d in deltas] == sorted(d.n_tokens for d in deltas)
    assert harness.state.live_rids == 0
    assert harness.finishes == []  # the engine ended them: nothing to tell it
    assert harness.state.tokens_in == sum(len(s) for s in ids.values())
    assert harness.state.chars_out == sum(len(tokenizer.decode(s)) for s in ids.values())


def test_prompt_tail_gives_context(qwen3):
    harness = Harness(qwen3)
    prompt = qwen3.encode("Say hi:").ids
    output = qwen3.encode(" hello there").ids
    harness.feed([Open("r", prompt, DetokParams())], [("r", Tokens(output, "stop"))])
    full = qwen3.decode(prompt + output)
    assert harness.text("r") == full[len(qwen3.decode(prompt)) :]


def test_one_text_batch_per_token_batch_even_without_news(qwen3):
    harness = Harness(qwen3)
    harness.feed([Open("r", [], DetokParams(stop=["zzz"]))], [])
    assert harness.feed([], [("r", Tokens([]))]) == []
    assert harness.state.live_rids == 1


@pytest.mark.parametrize("visible", [False, True])
def test_stop_string_hidden_and_visible(qwen3, visible):
    harness = Harness(qwen3)
    ids = qwen3.encode("one two STOP three four").ids
    params = DetokParams(stop=["STOP"], include_stop_str_in_output=visible)
    harness.feed([Open("r", [], params)], [])
    for chunk in _chunks(ids, 2):
        harness.feed([], [("r", Tokens(chunk))])
    full = qwen3.decode(ids)
    end = full.index("STOP") + (len("STOP") if visible else 0)
    assert harness.text("r") == full[:end]
    last = harness.last("r")
    assert (last.finish, last.stop_reason) == ("stop", "STOP")
    assert harness.finishes == [Finish("r", "stop", "STOP", last.n_tokens)]  # the ids the client got
    assert harness.state.live_rids == 0
    # later tokens (already in flight) are dropped silently
    assert harness.feed([], [("r", Tokens(ids[:2])), ("r", Tokens([], "length"))]) == []
    assert harness.state.bad[BAD_UNKNOWN_RID] == 0


def test_stop_string_split_across_tokens_never_leaks(qwen3):
    harness = Harness(qwen3)
    ids = qwen3.encode("alpha beta<|stop-here|>gamma").ids
    harness.feed([Open("r", [], DetokParams(stop=["<|stop-here|>"]))], [])
    for token in ids:
        harness.feed([], [("r", Tokens([token]))])
    assert harness.text("r") == "alpha beta"
    assert all("<|" not in d.text for d in harness.deltas["r"])


def test_eos_as_hidden_stop_token_from_the_engine(qwen3):
    """The engine adds EOS to stop_token_ids and sends it in the last item with finish="stop"."""
    eos = _eos(qwen3)
    harness = Harness(qwen3)
    ids = qwen3.encode("All done.").ids
    params = DetokParams(stop_token_ids=[eos])
    harness.feed([Open("r", [], params)], [("r", Tokens(ids[:1]))])
    harness.feed([], [("r", Tokens([*ids[1:], eos], "stop"))])
    assert harness.text("r") == qwen3.decode(ids)
    last = harness.last("r")
    assert (last.finish, last.stop_reason, last.n_tokens) == ("stop", eos, len(ids) + 1)
    assert harness.finishes == []  # the engine already ended it


def test_stop_token_found_by_the_worker_tells_the_engine(qwen3):
    eos = _eos(qwen3)
    harness = Harness(qwen3)
    ids = qwen3.encode("Before the end").ids
    tail = qwen3.encode(" after").ids
    harness.feed([Open("r", [], DetokParams(stop_token_ids=[eos]))], [("r", Tokens([*ids, eos, *tail]))])
    assert harness.text("r") == qwen3.decode(ids)
    assert harness.last("r").n_tokens == len(ids) + 1
    assert harness.finishes == [Finish("r", "stop", eos, len(ids) + 1)]


def test_visible_stop_token(qwen3):
    eos = _eos(qwen3)
    harness = Harness(qwen3)
    ids = qwen3.encode("Visible end").ids
    params = DetokParams(stop_token_ids=[eos], include_stop_str_in_output=True, skip_special_tokens=False)
    harness.feed([Open("r", [], params)], [("r", Tokens([*ids, eos]))])
    assert harness.text("r") == qwen3.decode([*ids, eos])
    assert harness.last("r").stop_reason == eos


def test_min_tokens_delays_stops(qwen3):
    harness = Harness(qwen3)
    ids = qwen3.encode("a, b, c, d").ids
    comma_index = next(i for i, t in enumerate(ids) if "," in qwen3.decode([t]))
    params = DetokParams(stop=[","], min_tokens=comma_index + 1)
    harness.feed([Open("r", [], params)], [("r", Tokens(ids))])
    full = qwen3.decode(ids)
    assert harness.text("r") == full[: full.index(",", full.index(",") + 1)]


def test_bad_token_id_ends_only_that_rid(fixture_tokenizer):
    tokenizer = fixture_tokenizer
    harness = Harness(tokenizer)
    good = tokenizer.encode("Good text here").ids
    other = tokenizer.encode("Other request").ids
    bad_id = tokenizer.vocab_size + 17
    harness.feed([Open("bad", [], DetokParams()), Open("ok", [], DetokParams())], [])
    harness.feed([], [("bad", Tokens([*good, bad_id, *good])), ("ok", Tokens(other[:2]))])
    last = harness.last("bad")
    assert last.finish == "error" and str(bad_id) in (last.error or "")
    assert last.engine_failed is None  # the worker's own failure, not the engine's
    assert harness.text("bad") == tokenizer.decode(good)[: len(harness.text("bad"))]
    assert harness.finishes == [Finish("bad", "error", None, last.n_tokens)]
    harness.feed([], [("ok", Tokens(other[2:], "length")), ("bad", Tokens(good))])
    assert harness.text("ok") == tokenizer.decode(other)
    assert harness.state.live_rids == 0


def test_negative_token_id_is_an_error(qwen3):
    harness = Harness(qwen3)
    harness.feed([Open("r", [], DetokParams())], [("r", Tokens([-5]))])
    assert harness.last("r").finish == "error"
    assert harness.finishes == [Finish("r", "error", None, 0)]


def test_engine_abort_frees_and_reports(qwen3):
    harness = Harness(qwen3)
    ids = qwen3.encode("This will be aborted halfway").ids
    harness.feed([Open("r", [], DetokParams(stop=["zzz"]))], [("r", Tokens(ids[:3]))])
    harness.feed([], [("r", Tokens([], "abort"))])
    assert harness.last("r").finish == "abort"
    assert harness.text("r") == qwen3.decode(ids[:3])
    assert harness.state.live_rids == 0


def test_engine_error_ends_with_a_message(qwen3):
    harness = Harness(qwen3)
    ids = qwen3.encode("partial output").ids
    harness.feed([Open("r", [], DetokParams())], [("r", Tokens(ids[:2]))])
    harness.feed([], [("r", Tokens(ids[2:], "error"))])
    last = harness.last("r")
    assert last.finish == "error" and last.error and last.engine_failed
    assert harness.text("r") == qwen3.decode(ids)
    assert harness.finishes == []  # the engine ended it itself


def test_engine_error_carries_the_engines_message(qwen3):
    harness = Harness(qwen3)
    ids = qwen3.encode("partial output").ids
    harness.feed([Open("r", [], DetokParams())], [("r", Tokens(ids[:2]))])
    harness.feed([], [("r", Tokens([], "error", "engine grpc://10.0.0.9:50051 is unreachable"))])
    last = harness.last("r")
    assert (last.finish, last.error, last.engine_failed) == (
        "error",
        "engine grpc://10.0.0.9:50051 is unreachable",
        True,
    )
    assert harness.text("r") == qwen3.decode(ids[:2])


def test_unknown_rid_is_counted_and_skipped(qwen3):
    harness = Harness(qwen3)
    assert harness.feed([], [("never-opened", Tokens([1, 2, 3]))]) == []
    assert harness.state.bad[BAD_UNKNOWN_RID] == 1
    assert harness.state.live_rids == 0


def test_reopen_replays_history_from_offset_zero(fixture_tokenizer):
    tokenizer = fixture_tokenizer
    harness = Harness(tokenizer)
    ids = tokenizer.encode(TEXTS[1] + " " + TEXTS[2]).ids
    half = len(ids) // 2
    harness.feed([Open("r", [], DetokParams())], [("r", Tokens(ids[:half]))])
    first_text = harness.text("r")
    # the engine re-routes: duplicate Open + the full history so far + new ids
    reopened = harness.feed([Open("r", [], DetokParams())], [("r", Tokens(ids[: half + 2]))])
    assert reopened[0].offset == 0
    assert reopened[0].text.startswith(first_text)
    harness.feed([], [("r", Tokens(ids[half + 2 :], "length"))])
    assert harness.text("r") == tokenizer.decode(ids)
    assert harness.last("r").n_tokens == len(ids)
    assert harness.state.live_rids == 0


def test_reopen_after_the_rid_ended_here_starts_again(qwen3):
    harness = Harness(qwen3)
    ids = qwen3.encode("again and again").ids
    harness.feed([Open("r", [], DetokParams())], [("r", Tokens(ids, "length"))])
    harness.feed([Open("r", [], DetokParams())], [("r", Tokens(ids[:1]))])
    assert harness.state.live_rids == 1
    assert harness.deltas["r"][-1].offset == 0


@pytest.mark.parametrize(
    ("params", "limits"),
    [
        (DetokParams(stop=["a", "b", "c"]), {"stop_limits": StopLimits(max_strings=2)}),
        (DetokParams(stop=["x" * 11]), {"stop_limits": StopLimits(max_string_chars=10)}),
        (DetokParams(stop=[""]), {}),
        (DetokParams(min_tokens=-1), {}),
        (DetokParams(stop_token_ids=[-3]), {}),
        (DetokParams(stop_token_ids=[10**12]), {}),
    ],
)
def test_unusable_params_end_the_rid_with_an_error(qwen3, params, limits):
    harness = Harness(qwen3, **limits)
    harness.feed([Open("r", [], params)], [("r", Tokens([1, 2]))])
    (delta,) = harness.deltas["r"]
    assert (delta.finish, delta.offset, delta.text) == ("error", 0, "")
    assert delta.error
    assert harness.finishes == [Finish("r", "error", None, 0)]
    assert harness.state.live_rids == 0
    assert harness.state.bad[BAD_PARAMS] == 1
    assert harness.state.bad[BAD_UNKNOWN_RID] == 0  # the following Tokens were dropped quietly


def test_state_is_freed_and_the_ended_set_is_bounded(qwen3):
    harness = Harness(qwen3)
    ids = qwen3.encode("x").ids
    for batch in range(3):
        rids = [f"r{batch}-{i}" for i in range(RECENTLY_ENDED_CAPACITY // 2)]
        harness.state.handle_batch(
            token_batch(
                batch, 0, [Open(rid, [], DetokParams()) for rid in rids], [(r, Tokens(ids, "stop")) for r in rids]
            )
        )
    assert harness.state.live_rids == 0
    # recently ended rids: late tokens are dropped quietly
    harness.feed([], [(f"r2-{RECENTLY_ENDED_CAPACITY // 2 - 1}", Tokens(ids)), ("r1-0", Tokens(ids))])
    assert harness.state.bad[BAD_UNKNOWN_RID] == 0
    # the oldest ended rids were forgotten (bounded memory): a late Tokens item for one counts as unknown
    harness.feed([], [("r0-0", Tokens(ids))])
    assert harness.state.bad[BAD_UNKNOWN_RID] == 1


def test_live_stop_chars_are_bounded_per_worker(qwen3):
    harness = Harness(qwen3, max_live_stop_chars=100)
    ids = qwen3.encode("hello").ids
    harness.feed([Open("a", [], DetokParams(stop=["x" * 60]))], [("a", Tokens(ids))])
    harness.feed([Open("b", [], DetokParams(stop=["y" * 50]))], [("b", Tokens(ids))])  # 110 > 100: refused
    (refused,) = harness.deltas["b"]
    assert refused.finish == "error"
    assert "worker.max_live_stop_chars = 100" in refused.error
    assert harness.state.bad[BAD_STOP_BUDGET] == 1
    assert harness.state.live_stop_chars == 60
    harness.feed([], [("a", Tokens([], "length"))])  # a ends: its characters are free again
    assert harness.state.live_stop_chars == 0
    harness.feed([Open("c", [], DetokParams(stop=["y" * 50]))], [("c", Tokens(ids))])
    assert harness.text("c") == "hello"
    assert harness.state.live_stop_chars == 50


def test_a_long_batch_ticks_between_opens(qwen3):
    ticks: list[int] = []
    state = WorkerState(qwen3, "w-test")
    opens = [Open(f"r{i}", [], DetokParams(stop=["zz"])) for i in range(5)]
    items = [(f"r{i}", Tokens([1])) for i in range(5)]
    state.handle_batch(token_batch(1, 0, opens, items), lambda: ticks.append(state.live_rids))
    assert ticks == [1, 2, 3, 4, 5]  # after each open, before any item is decoded


def test_a_rid_with_stop_strings_that_the_engine_ended_gets_the_workers_verdict(fixture_tokenizer):
    """The engine waits for it (its stats count such a rid's end as its client saw it): a stop string in the last
    ids makes it "stop" with the ids kept; without one the engine's finish stands. A rid without stop strings that
    the engine ended needs no Finish."""
    tokenizer = fixture_tokenizer
    harness = Harness(tokenizer)
    ids = tokenizer.encode("Hello, world! The quick brown fox").ids
    with_stop = DetokParams(stop=["quick"])
    opens = [
        Open("found", [], with_stop),
        Open("missed", [], DetokParams(stop=["zebra"])),
        Open("plain", [], DetokParams()),
    ]
    harness.feed(opens, [(rid, Tokens(ids, "length")) for rid in ("found", "missed", "plain")])
    verdicts = {finish.rid: finish for finish in harness.finishes}
    assert sorted(verdicts) == ["found", "missed"]
    found, missed = verdicts["found"], verdicts["missed"]
    assert (found.reason, found.stop_reason) == ("stop", "quick")
    assert found.n_tokens == harness.last("found").n_tokens < len(ids)
    assert harness.last("found").finish == "stop"
    assert (missed.reason, missed.stop_reason, missed.n_tokens) == ("length", None, len(ids))
