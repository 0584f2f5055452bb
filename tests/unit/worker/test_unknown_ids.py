"""Ids the engine's model can emit but the tokenizer lacks (Open.vocab_size: a model's vocabulary padded past its
tokenizer's, or a gap in the tokenizer's ids): a worker decodes them exactly as the tokenizer's full decode does
(Hugging Face `tokenizers` drops them, so the bytes of a character split across one still join), counts them as
generated tokens and as unknown ids; an id past the model's vocabulary, or any id the tokenizer lacks when the
engine gave no vocabulary size, still ends only its own request with an error. Byte-level (qwen3, gpt4o with its
gaps, tiktoken's o200k_base), byte-fallback (mistral-sp-v1) and SentencePiece's own library (the generic stream),
through the batches' columns and as items."""

from __future__ import annotations

import random
import tempfile
from functools import cache
from pathlib import Path

import mistral_common
import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.texts import load_texts
from helpers.tokenizer_files import o200k_rank_file_bytes, reference_hf_tokenizer
from helpers.worker_batches import Request, engine_batches, run_batches, with_extras

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Finish, Open, TokenLogprob, Tokens
from detok_worker.tokenizer import create_tokenizer
from detok_worker.tokenizer.backends.tiktoken import load_named_encoding, tiktoken_cache_file
from detok_worker.worker.state import WorkerState

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
SPLIT = "\ufffd"


def _o200k_base():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", tempfile.mkdtemp(prefix="detok-o200k-"))
        tiktoken_cache_file("o200k_base").write_bytes(o200k_rank_file_bytes())
        return load_named_encoding("o200k_base")


# case -> (tokenizer, the fixture whose tokenizer.json is the reference decode, the model's vocabulary size)
CASES = {
    "qwen3": (lambda: load_fixture_tokenizer("qwen3"), "qwen3", 151_936),
    "mistral-sp-v1": (lambda: load_fixture_tokenizer("mistral-sp-v1"), "mistral-sp-v1", 32_768),
    "sentencepiece-v1": (lambda: create_tokenizer(MISTRAL_DATA / "tokenizer.model.v1"), "mistral-sp-v1", 32_768),
    "gpt4o": (lambda: load_fixture_tokenizer("gpt4o"), "gpt4o", 200_064),
    "tiktoken-o200k": (_o200k_base, "gpt4o", 200_064),
}


@cache
def loaded(case: str):
    """(tokenizer, reference tokenizers.Tokenizer, model vocabulary size, the ids below it the reference lacks)."""
    load, fixture, model_vocab = CASES[case]
    reference = reference_hf_tokenizer(fixture)
    known = set(reference.get_vocab(with_added_tokens=True).values())
    return load(), reference, model_vocab, [i for i in range(model_vocab) if i not in known]


def _split_points(reference, ids: list[int]) -> list[int]:
    """Positions inside a character split across tokens (the text before them ends in an unfinished one)."""
    return [k for k in range(1, len(ids)) if reference.decode(ids[:k], skip_special_tokens=False).endswith(SPLIT)]


def _requests(case: str, seed: int, model_vocab: int | None = None) -> list[Request]:
    """Every test text, with ids the tokenizer lacks first, last, inside split characters and at random places, a
    special token or two, skip_special_tokens on and off; the engine's vocabulary size on each Open."""
    tokenizer, reference, vocab, unknown = loaded(case)
    rng = random.Random(seed)
    specials = sorted(tokenizer.special_token_ids)
    requests, split = [], 0
    for index, text in enumerate(load_texts().values()):
        ids = list(tokenizer.encode(text).ids)
        inside = _split_points(reference, ids)
        for position in sorted(rng.sample(inside, min(3, len(inside))), reverse=True):
            ids.insert(position, rng.choice(unknown))
            split += 1
        for _ in range(3):
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(unknown))
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        ids = [rng.choice(unknown), *ids, rng.choice(unknown)]
        params = DetokParams(skip_special_tokens=index % 2 == 0)
        requests.append(Request(params, ids, vocab if model_vocab is None else model_vocab))
    assert split >= 9  # characters split across tokens are cut by ids without text
    return requests


def _texts(deltas: dict[str, list]) -> dict[str, str]:
    texts = {}
    for rid, rid_deltas in deltas.items():
        text = ""
        for offset, delta_text, *_ in rid_deltas:
            assert offset == len(text)
            text += delta_text
        texts[rid] = text
    return texts


@pytest.mark.parametrize("case", list(CASES))
def test_ids_the_model_can_emit_decode_as_the_full_decode_drops_them(case: str) -> None:
    tokenizer, reference, vocab, unknown = loaded(case)
    requests = _requests(case, seed=7)
    expected = {
        f"r{index}": reference.decode(request.ids, skip_special_tokens=request.params.skip_special_tokens)
        for index, request in enumerate(requests)
    }
    lacking = set(unknown)
    unknown_count = sum(1 for request in requests for token_id in request.ids if token_id in lacking)
    assert any(token_id < tokenizer.vocab_size for token_id in lacking) == (case in ("gpt4o", "tiktoken-o200k"))
    batches = engine_batches(requests, seed=3)
    for fed in (batches, with_extras(batches)):
        state = WorkerState(tokenizer, "w")
        deltas, finishes = run_batches(state, fed)
        assert finishes == []
        assert _texts(deltas) == expected
        ends = {rid: rid_deltas[-1][2:] for rid, rid_deltas in deltas.items()}
        assert ends == {f"r{i}": (len(r.ids), "length", None, None) for i, r in enumerate(requests)}
        assert state.unknown_ids == unknown_count
        assert state.live_rids == 0


@pytest.mark.parametrize("case", ["qwen3", "mistral-sp-v1", "sentencepiece-v1", "gpt4o"])
def test_without_a_vocabulary_size_an_id_the_tokenizer_lacks_is_an_error(case: str) -> None:
    tokenizer, reference, _, unknown = loaded(case)
    requests = _requests(case, seed=11, model_vocab=0)
    deltas, finishes = run_batches(WorkerState(tokenizer, "w"), engine_batches(requests, seed=5))
    assert finishes == [(f"r{index}", "error", None) for index in range(len(requests))]
    for index, request in enumerate(requests):
        end = deltas[f"r{index}"][-1]
        assert end[3] == "error" and f"token id {request.ids[0]} " in end[5]
        assert end[2] == 0 and _texts({"r": deltas[f"r{index}"]})["r"] == ""


def test_an_id_past_the_models_vocabulary_ends_only_its_request() -> None:
    tokenizer, reference, vocab, _ = loaded("qwen3")
    ids = tokenizer.encode("a jellyfish: 🪼").ids
    lacking = [tokenizer.vocab_size, vocab - 1]
    state = WorkerState(tokenizer, "w")
    opens = [Open(rid, [], DetokParams(), vocab_size=vocab) for rid in ("bad", "ok")]
    batch = token_batch(
        1, 0, opens, [("bad", Tokens([*ids[:2], lacking[0], vocab, *ids[2:]])), ("ok", Tokens(ids[:2]))]
    )
    result = state.handle_batch(batch)
    assert result.finishes == [Finish("bad", "error", None, 3)]
    (bad,) = [delta for delta in text_deltas(result.text_batch) if delta.rid == "bad"]
    assert (bad.text, bad.n_tokens, bad.finish) == (reference.decode(ids[:2]), 3, "error")
    assert bad.error == f"token id {vocab} is out of range for the model (valid ids: ints 0..{vocab - 1})"
    result = state.handle_batch(token_batch(2, 0, [], [("ok", Tokens([lacking[1], *ids[2:], lacking[0]], "length"))]))
    (ok,) = text_deltas(result.text_batch)
    assert (ok.text, ok.n_tokens, ok.finish) == (reference.decode(ids[2:]), len(ids) + 2, "length")
    assert state.unknown_ids == 3 and state.live_rids == 0


def test_stop_rules_count_and_see_through_ids_without_text() -> None:
    tokenizer, _, vocab, _ = loaded("qwen3")
    lacking = tokenizer.vocab_size + 5
    eos = min(tokenizer.eos_token_ids)
    state = WorkerState(tokenizer, "w")
    words = tokenizer.encode("so we went to the end of it").ids
    the = words.index(tokenizer.encode(" the").ids[0])
    opens = [
        Open("string", [], DetokParams(stop=["the end"]), vocab_size=vocab),
        Open("token", [], DetokParams(stop_token_ids=[eos], min_tokens=3), vocab_size=vocab),
    ]
    items = [
        ("string", Tokens([*words[: the + 1], lacking, *words[the + 1 :]])),  # the stop string runs across it
        ("token", Tokens([lacking, eos, lacking, eos, *words])),  # the second EOS is the fourth token: past min_tokens
    ]
    result = state.handle_batch(token_batch(1, 0, opens, items))
    ends = {delta.rid: delta for delta in text_deltas(result.text_batch)}
    string, token = ends["string"], ends["token"]
    assert (string.text, string.stop_reason, string.n_tokens) == ("so we went to ", "the end", the + 3)
    assert (token.text, token.stop_reason, token.n_tokens) == ("", eos, 4)
    assert result.finishes == [Finish("string", "stop", "the end", the + 3), Finish("token", "stop", eos, 4)]
    assert state.unknown_ids == 3


def test_logprobs_of_an_id_without_text_are_empty() -> None:
    tokenizer, _, vocab, _ = loaded("qwen3")
    jellyfish = tokenizer.encode("🪼!").ids
    lacking = tokenizer.vocab_size + 1
    ids = [jellyfish[0], lacking, *jellyfish[1:]]
    logprobs = [TokenLogprob(-0.25 * (k + 1), [lacking, ids[k]], [-3.0, -0.1]) for k in range(len(ids))]
    state = WorkerState(tokenizer, "w")
    opens = [Open("r", [], DetokParams(), vocab_size=vocab)]
    result = state.handle_batch(token_batch(1, 0, opens, [("r", Tokens(ids, "length", None, logprobs))]))
    (delta,) = text_deltas(result.text_batch)
    assert delta.text == "🪼!" and delta.n_tokens == len(ids)
    entries = delta.logprobs or []
    assert [(entry.token, entry.token_bytes) for entry in entries][1] == ("", b"")
    assert b"".join(entry.token_bytes for entry in entries) == "🪼!".encode()
    assert all(entry.top[1].token == "" and entry.top[1].token_bytes == b"" for entry in entries)
    without = WorkerState(tokenizer, "w").handle_batch(
        token_batch(1, 0, [Open("r", [], DetokParams())], [("r", Tokens(ids, "length", None, logprobs))])
    )
    assert text_deltas(without.text_batch)[-1].finish == "error"  # no vocabulary size: the id is bad, as before
