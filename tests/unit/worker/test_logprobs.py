"""The worker's logprobs: token strings and bytes added to the engine's ids and values, entries riding on the delta
whose text their tokens produced, one entry per consumed token (real fixture tokenizers)."""

from __future__ import annotations

import pytest
from helpers.fixtures import load_fixture_tokenizer

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, LogprobText, Open, TextDelta, TokenLogprob, Tokens
from detok_worker.worker.state import WorkerState
from engine_stub.fake_logprobs import fake_logprobs, fake_value

TEXT = "Emoji 🪼👨‍👩‍👧 and CJK 今天的天气很好。東京の朝は早い。 done"
TOP = 4
PLAIN = DetokParams()


def _run(tokenizer, ids: list[int], size: int, params: DetokParams = PLAIN, finish: str = "length"):
    """Feed `ids` with fake logprobs in batches of `size`; returns (deltas, worker state)."""
    state = WorkerState(tokenizer, "w")
    logprobs = fake_logprobs(ids, TOP, tokenizer)
    deltas: list[TextDelta] = []
    batches = [(ids[i : i + size], logprobs[i : i + size]) for i in range(0, len(ids), size)]
    for step, (chunk, chunk_logprobs) in enumerate(batches):
        opens = [Open("r", [], params)] if step == 0 else []
        end = finish if step == len(batches) - 1 else None
        batch = token_batch(step, 0, opens, [("r", Tokens(chunk, end, None, chunk_logprobs))])
        deltas += text_deltas(state.handle_batch(batch).text_batch)
    return deltas, state


def _entries(deltas: list[TextDelta]) -> list[LogprobText]:
    return [entry for delta in deltas for entry in delta.logprobs or []]


def _splitting_ids(tokenizer, ids: list[int]) -> list[int]:
    """Ids whose own bytes are not whole UTF-8 (a piece of a character)."""
    found = []
    for entry, token_id in zip(_entries(_run(tokenizer, ids, len(ids))[0]), ids, strict=True):
        try:
            entry.token_bytes.decode("utf-8")
        except UnicodeDecodeError:
            found.append(token_id)
    return found


@pytest.mark.parametrize("size", [1, 3, 7])
def test_byte_level_entries_follow_the_text(size: int) -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    ids = qwen3.encode(TEXT).ids
    deltas, state = _run(qwen3, ids, size)
    entries = _entries(deltas)
    assert len(entries) == deltas[-1].n_tokens == len(ids)
    # a token string is the id's decode alone, but a piece of a character gives "" and the token that completes the
    # character all of it (vLLM's rule): so the strings join into the text, as the bytes do
    for entry, token_id in zip(entries, ids, strict=True):
        alone = qwen3.decode([token_id])
        assert entry.token == alone or (alone.endswith("\ufffd") and "\ufffd" not in entry.token)
    assert "".join(entry.token for entry in entries) == TEXT
    assert b"".join(entry.token_bytes for entry in entries) == TEXT.encode("utf-8")
    # each delta carries the entries of the tokens consumed up to it: their bytes are its text and the deltas'
    # before it, plus at most the start of a character the next delta finishes
    text, joined = "", b""
    for delta in deltas:
        text += delta.text
        joined += b"".join(entry.token_bytes for entry in delta.logprobs or [])
        assert joined.decode("utf-8", errors="ignore") == text
        assert len(joined) - len(text.encode("utf-8")) < 4
        assert len(_entries(deltas[: deltas.index(delta) + 1])) == delta.n_tokens
    for position, (entry, token_id) in enumerate(zip(entries, ids, strict=True)):
        assert entry.logprob == fake_value(position, token_id)
        values = [top.logprob for top in entry.top]
        assert len(values) == TOP and values == sorted(values, reverse=True)
        assert (entry.token, entry.logprob) in [(top.token, top.logprob) for top in entry.top]
    assert state.live_rids == 0


def test_byte_level_partial_characters() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    ids = qwen3.encode("🪼 今天").ids
    entries = _entries(_run(qwen3, ids, 1)[0])
    jellyfish = "🪼".encode()
    count = next(k for k in range(1, len(entries) + 1) if b"".join(e.token_bytes for e in entries[:k]) == jellyfish)
    assert count >= 2, "the jellyfish takes several byte-level tokens"
    for entry, token_id in zip(entries[:count], ids, strict=False):
        assert jellyfish.find(entry.token_bytes) >= 0 and len(entry.token_bytes) < len(jellyfish)
        assert qwen3.decode([token_id]).endswith("\ufffd")  # a lone piece decodes to U+FFFD ...
    # ... so its token string is "" until the token that completes the character, which gives all of it
    assert [entry.token for entry in entries[:count]] == [""] * (count - 1) + ["🪼"]
    assert _splitting_ids(qwen3, ids) == ids[:count]


def test_byte_fallback_tokens_give_their_byte() -> None:
    mistral = load_fixture_tokenizer("mistral-sp-v1")
    ids = mistral.encode(TEXT).ids
    deltas, _ = _run(mistral, ids, 2)
    entries = _entries(deltas)
    assert len(entries) == len(ids) == deltas[-1].n_tokens
    # a word piece's token string keeps its leading space (vLLM's rule): "▁Em" decodes alone to "Em"; the byte
    # tokens of a character give "" then the character
    for entry, token_id in zip(entries, ids, strict=True):
        piece, alone = mistral.id_to_token(token_id), mistral.decode([token_id])
        if not alone.endswith("\ufffd"):
            assert entry.token == (" " + alone if piece.startswith("\u2581") and not alone.startswith(" ") else alone)
    assert sum(entry.token.startswith(" ") for entry in entries) >= 3
    assert "".join(entry.token for entry in entries) == " " + TEXT
    pairs = zip(entries, ids, strict=True)
    byte_tokens = [(entry, token_id) for entry, token_id in pairs if mistral.id_to_token(token_id)[:3] == "<0x"]
    assert len(byte_tokens) >= 4, "the emoji have no piece of their own: byte-fallback tokens"
    for entry, token_id in byte_tokens:
        assert entry.token_bytes == bytes([int(mistral.id_to_token(token_id)[3:5], 16)])
    # the bytes of all tokens are the output's UTF-8 (SentencePiece's leading space aside)
    assert b"".join(entry.token_bytes for entry in entries).decode("utf-8").lstrip(" ") == TEXT


def test_stop_string_counts_tokens_up_to_the_stop() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    ids = qwen3.encode("one two STOP three four five").ids
    deltas, _ = _run(qwen3, ids, 1, DetokParams(stop=["STOP"]), finish="stop")
    entries = _entries(deltas)
    assert deltas[-1].finish == "stop" and deltas[-1].stop_reason == "STOP"
    assert "".join(delta.text for delta in deltas) == "one two "
    assert len(entries) == deltas[-1].n_tokens < len(ids)
    assert [entry.token for entry in entries] == [qwen3.decode([i]) for i in ids[: len(entries)]]
    assert "".join(entry.token for entry in entries).startswith("one two STOP")


def test_held_entries_go_with_an_engine_abort() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    ids = qwen3.encode("🪼").ids
    state = WorkerState(qwen3, "w")
    logprobs = fake_logprobs(ids, 0, qwen3)
    open_ = Open("r", [], DetokParams())
    first = state.handle_batch(token_batch(1, 0, [open_], [("r", Tokens(ids[:1], None, None, logprobs[:1]))]))
    assert text_deltas(first.text_batch) == []  # an unfinished character: no text, its entry is held
    last = state.handle_batch(token_batch(2, 0, [], [("r", Tokens([], "abort"))]))
    (delta,) = text_deltas(last.text_batch)
    assert delta.finish == "abort" and len(delta.logprobs) == 1 == delta.n_tokens
    assert delta.logprobs[0].top == []


def test_requests_without_logprobs_get_none() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    state = WorkerState(qwen3, "w")
    ids = qwen3.encode(TEXT).ids
    result = state.handle_batch(token_batch(1, 0, [Open("r", [], DetokParams())], [("r", Tokens(ids, "length"))]))
    assert [delta.logprobs for delta in text_deltas(result.text_batch)] == [None]


def test_bad_logprobs_end_only_that_rid() -> None:
    qwen3 = load_fixture_tokenizer("qwen3")
    state = WorkerState(qwen3, "w")
    ids = qwen3.encode("hello").ids
    short = [TokenLogprob(-0.5)] * (len(ids) - 1)
    opens = [Open("bad", [], DetokParams()), Open("good", [], DetokParams())]
    items = [("bad", Tokens(ids, None, None, short)), ("good", Tokens(ids, "length"))]
    deltas = text_deltas(state.handle_batch(token_batch(1, 0, opens, items)).text_batch)
    by_rid = {delta.rid: delta for delta in deltas}
    assert by_rid["bad"].finish == "error" and "logprobs" in by_rid["bad"].error
    assert by_rid["good"].text == "hello" and by_rid["good"].finish == "length"
