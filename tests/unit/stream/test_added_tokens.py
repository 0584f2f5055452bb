"""spaces_between_special_tokens false (special tokens kept) as vLLM's fast detokenizer applies it: its rule is
replayed here on the `tokenizers` library's own DecodeStream (what vLLM steps), and detok's streamed text must equal
it, id by id and in batches, on every fixture family. Where the rule changes nothing (byte-level and SentencePiece
decoders give an added token its content anyway) that is also transformers' decode with the option; WordPiece joins
tokens with a space, which vLLM drops between two added tokens while transformers' decode (which ignores the option
for these tokenizers) keeps it."""

from __future__ import annotations

import lzma
import random
from functools import cache
from typing import Any

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, TEXT_DECODER_FIXTURE_DIRS, load_fixture_tokenizer
from helpers.texts import load_texts
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.decoders import DecodeStream as RustDecodeStream

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, Tokens
from detok_worker.stream import StopSequenceConfig, StopSequenceDecoder
from detok_worker.stream.decode import create_decode_stream
from detok_worker.worker.state import WorkerState

transformers = pytest.importorskip("transformers")
FAMILIES = ["qwen3", "deepseek-v3", "gpt-oss", "mistral-sp-v1", "gpt4o", "claude", "bert-wordpiece"]
UNCHANGED = {"qwen3", "deepseek-v3", "gpt-oss", "mistral-sp-v1", "gpt4o", "claude"}  # decoders without a separator


@cache
def rust_tokenizer(family: str) -> RustTokenizer:
    directory = {**FIXTURE_TOKENIZER_DIRS, **TEXT_DECODER_FIXTURE_DIRS}[family]
    return RustTokenizer.from_str(lzma.decompress((directory / "tokenizer.json.xz").read_bytes()).decode())


@cache
def transformers_tokenizer(family: str) -> Any:
    return transformers.TokenizersBackend(tokenizer_object=rust_tokenizer(family))


def vllm_text(tokenizer: RustTokenizer, ids: list[int]) -> str:
    """vLLM's FastIncrementalDetokenizer.decode_next with skip_special_tokens and spaces_between_special_tokens
    false, over the whole output: an added token after an added token gives its content."""
    added = {token_id: token.content for token_id, token in tokenizer.get_added_tokens_decoder().items()}
    stream = RustDecodeStream(skip_special_tokens=False)
    text, last_added = "", False
    for token_id in ids:
        piece = stream.step(tokenizer, token_id) or ""
        content = added.get(token_id)
        if content is not None and last_added:
            piece = content
        last_added = content is not None
        text += piece
    return text


def mixed_ids(tokenizer: Any, seed: int) -> list[int]:
    """Real text (whole characters) with runs of one to three added tokens (special or not) put in between
    characters at random places."""
    rng = random.Random(seed)
    added = sorted(tokenizer.added_token_contents())
    ids = list(tokenizer.encode(rng.choice(list(load_texts().values()))[:200]).ids)
    between = [at for at in range(len(ids) + 1) if not tokenizer.decode(ids[:at]).endswith("\ufffd")]
    for at in sorted(rng.sample(between, 8), reverse=True):
        ids[at:at] = [rng.choice(added) for _ in range(rng.randint(1, 3))]
    return ids


def streamed(tokenizer: Any, ids: list[int], batch: int) -> str:
    decoder = StopSequenceDecoder(
        tokenizer, StopSequenceConfig(), skip_special_tokens=False, spaces_between_special_tokens=False
    )
    text = "".join(decoder.process_tokens(ids[i : i + batch]).text for i in range(0, len(ids), batch))
    return text + decoder.flush().text


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streamed_text_is_vllms(family: str, seed: int) -> None:
    tokenizer = load_fixture_tokenizer(family)
    rust = rust_tokenizer(family)
    ids = mixed_ids(tokenizer, seed)
    expected = vllm_text(rust, ids)
    assert streamed(tokenizer, ids, 1) == streamed(tokenizer, ids, 7) == expected
    reference = transformers_tokenizer(family)
    theirs = reference.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=False)
    assert (theirs == expected) == (family in UNCHANGED), (theirs, expected)


def test_wordpiece_drops_the_space_between_added_tokens_only() -> None:
    tokenizer = load_fixture_tokenizer("bert-wordpiece")
    cls, sep, unk = (tokenizer.token_to_id(token) for token in ("[CLS]", "[SEP]", "[UNK]"))
    hello = tokenizer.encode("hello world", add_special_tokens=False).ids
    ids = [cls, *hello, sep, cls, unk, *hello[:1]]
    assert streamed(tokenizer, ids, 1) == "[CLS] hello world [SEP][CLS][UNK] hello"
    spaced = create_decode_stream(tokenizer, (), False)
    assert "".join(spaced.step_batch(ids)) + (spaced.flush() or "") == "[CLS] hello world [SEP] [CLS] [UNK] hello"


def test_only_requests_that_keep_special_tokens_and_ask_lose_the_lookups() -> None:
    """vLLM: the option acts only with skip_special_tokens false; a request without it keeps the decoder's lookups
    (StopSequenceDecoder.process_one's first branch)."""
    tokenizer = load_fixture_tokenizer("qwen3")
    state = WorkerState(tokenizer, "w")
    asks = DetokParams(skip_special_tokens=False, spaces_between_special_tokens=False)
    skipping = DetokParams(spaces_between_special_tokens=False)
    opens = [Open("asks", [], asks), Open("skipping", [], skipping), Open("plain", [], DetokParams())]
    state.handle_batch(token_batch(0, 0, opens, []))
    assert state.live["asks"].decoder._table is None
    assert state.live["skipping"].decoder._table is not None and state.live["plain"].decoder._table is not None
    im_start, im_end = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    items = [(rid, Tokens([im_start, im_end, *tokenizer.encode("Hi").ids])) for rid in ("asks", "skipping")]
    texts = {
        delta.rid: delta.text for delta in text_deltas(state.handle_batch(token_batch(1, 0, [], items)).text_batch)
    }
    assert texts == {"asks": "<|im_start|><|im_end|>Hi", "skipping": "Hi"}
