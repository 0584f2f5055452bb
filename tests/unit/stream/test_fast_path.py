"""The byte-level fast path: selected where its tables are verified, refused where they cannot reproduce decode,
and built on a UTF-8 rule that matches Rust's from_utf8_lossy."""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Sequence

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers

from detok_worker.stream import DecodeStream, byte_decoding_for, fast_path_status
from detok_worker.tokenizer.backends.hf import HFTokenizer

NAMES = sorted(FIXTURE_TOKENIZER_DIRS)


@pytest.mark.parametrize("name", NAMES)
def test_fast_path_is_selected_for_every_fixture(name: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    status = fast_path_status(tokenizer)
    assert status.decoding is not None, status.reason
    assert status.decoding.byte_fallback == (name == "mistral-sp-v1")
    assert byte_decoding_for(tokenizer) is status.decoding  # built once, then shared
    assert DecodeStream(tokenizer).fast_path is True
    assert DecodeStream(tokenizer, force_generic=True).fast_path is False
    assert isinstance(DecodeStream(tokenizer), DecodeStream)


def _stream_all(tokenizer, ids: Sequence[int], *, skip: bool = False) -> str:
    stream = DecodeStream(tokenizer, (), skip)
    return "".join(stream.step_batch(ids)) + (stream.flush() or "")


def test_fast_path_is_refused_for_a_wordpiece_decoder() -> None:
    vocab = {"[UNK]": 0, "[CLS]": 1, "un": 2, "##aff": 3, "##able": 4, "hello": 5, "world": 6, "!": 7}
    rust = RustTokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    rust.decoder = decoders.WordPiece()
    tokenizer = HFTokenizer(rust, name="wordpiece")
    assert tokenizer.token_bytes_table() is None
    assert fast_path_status(tokenizer).decoding is None
    stream = DecodeStream(tokenizer)
    assert stream.fast_path is False
    ids = tokenizer.encode("hello unaffable world!").ids
    # WordPiece joins "##" pieces to the word before and cleans up " !" to "!".
    assert [stream.step(i) for i in ids] == ["hello", " un", "aff", "able", " world", "!"]
    assert tokenizer.decode(ids) == "hello unaffable world!"


class LowercasingTokenizer:
    """A backend whose decode lowercases: its byte table (borrowed from Qwen3) does not describe its decode.

    Stands for any decoder step the fast path does not model; the fast path must notice and refuse."""

    def __init__(self, inner: HFTokenizer) -> None:
        self._inner = inner
        self.name = "lowercasing-qwen3"
        self.vocab_size = inner.vocab_size
        self.special_tokens = inner.special_tokens
        self.special_token_ids = inner.special_token_ids
        self.eos_token_ids = inner.eos_token_ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._inner.decode(ids, skip_special_tokens).lower()

    def decode_batch(self, sequences: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> list[str]:
        return [text.lower() for text in self._inner.decode_batch(sequences, skip_special_tokens)]

    def token_bytes_table(self):
        return self._inner.token_bytes_table()

    def check_ids(self, ids: Sequence[int]) -> None:
        self._inner.check_ids(ids)

    def encode(self, text: str, add_special_tokens: bool = False):
        return self._inner.encode(text, add_special_tokens)


def test_fast_path_is_refused_when_the_table_does_not_reproduce_decode() -> None:
    tokenizer = LowercasingTokenizer(load_fixture_tokenizer("qwen3"))
    status = fast_path_status(tokenizer)
    assert status.decoding is None
    assert "does not reproduce decode" in status.reason
    ids = tokenizer.encode("Hello World \U0001fae8 ÄÖÜ").ids
    stream = DecodeStream(tokenizer)
    assert stream.fast_path is False
    assert "".join(stream.step_batch(ids)) + (stream.flush() or "") == "hello world \U0001fae8 äöü"


def _byte_level_token_strings() -> list[str]:
    """The 256 single-byte tokens of Qwen3's ByteLevel vocabulary, indexed by byte."""
    tokenizer = load_fixture_tokenizer("qwen3")
    table = byte_decoding_for(tokenizer)
    assert table is not None
    by_byte: dict[int, str] = {}
    for token_id, piece in enumerate(table.keep.pieces):
        if piece is not None and len(piece) == 1 and token_id not in tokenizer.special_token_ids:
            by_byte.setdefault(piece[0], tokenizer.id_to_token(token_id))
    assert len(by_byte) == 256
    return [by_byte[b] for b in range(256)]


_SINGLE_BYTE_TOKENS: list[str] = []


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=24),
        st.lists(st.sampled_from([0x41, 0x80, 0xBF, 0xC2, 0xE0, 0xE4, 0xED, 0xF0, 0xF4, 0xF5, 0xFF])).map(bytes),
    ),
    cuts=st.lists(st.integers(0, 24), max_size=4),
)
def test_python_replacement_matches_rust_from_utf8_lossy(data: bytes, cuts: list[int]) -> None:
    """Python's errors="replace" (whole and incremental) must equal the Rust ByteLevel decoder's lossy decode."""
    if not _SINGLE_BYTE_TOKENS:
        _SINGLE_BYTE_TOKENS.extend(_byte_level_token_strings())
    rust = decoders.ByteLevel().decode([_SINGLE_BYTE_TOKENS[b] for b in data])
    assert data.decode("utf-8", "replace") == rust
    pending, out = b"", []
    for start, end in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)], strict=True):
        text, consumed = utf_8_decode(pending + data[start:end], "replace", False)
        pending = (pending + data[start:end])[consumed:]
        out.append(text)
    out.append(utf_8_decode(pending, "replace", True)[0])
    assert "".join(out) == rust


def _tiny_byte_level_tokenizer(decoder: decoders.Decoder) -> HFTokenizer:
    """A small ByteLevel BPE: the 256 byte tokens, a few merges' worth of words, and added tokens whose text
    contains ByteLevel characters ("Ġ" is the space byte)."""
    byte_tokens = _byte_level_token_strings()
    vocab = {token: i for i, token in enumerate(byte_tokens)}
    vocab.update({"Ġhello": 256, "Ġworld": 257})
    rust = RustTokenizer(models.BPE(vocab, [], byte_fallback=False))
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoder
    rust.add_tokens(["<ĠplainĠ>"])
    rust.add_special_tokens(["<|Ġend|>"])
    return HFTokenizer(rust, name="tiny-byte-level")


def test_added_tokens_go_through_the_decoder_and_the_fast_path_agrees() -> None:
    tokenizer = _tiny_byte_level_tokenizer(decoders.ByteLevel())
    plain, end = tokenizer.token_to_id("<ĠplainĠ>"), tokenizer.token_to_id("<|Ġend|>")
    # tokenizers 0.23 runs added tokens (special or not) through the ByteLevel decoder: "Ġ" becomes a space.
    assert tokenizer.decode([256, plain, end]) == " hello< plain ><| end|>"
    assert tokenizer.decode([256, plain, end], skip_special_tokens=True) == " hello< plain >"
    assert fast_path_status(tokenizer).decoding is not None
    for skip in (False, True):
        ids = [256, plain, 0xE4, end, 0xBD, 0xA0, 257]  # ids < 256 are the byte tokens: "你" split by a special
        assert _stream_all(tokenizer, ids, skip=skip) == tokenizer.decode(ids, skip)


@pytest.mark.parametrize(
    "decoder",
    [
        decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)]),
        decoders.Metaspace(),
        decoders.BPEDecoder(),
    ],
    ids=["byte-level+strip", "metaspace", "bpe-suffix"],
)
def test_fast_path_is_refused_for_decoders_it_does_not_model(decoder: decoders.Decoder) -> None:
    tokenizer = _tiny_byte_level_tokenizer(decoder)
    status = fast_path_status(tokenizer)
    assert status.decoding is None, status.reason
    ids = [256, 257, tokenizer.token_to_id("<ĠplainĠ>"), 256]
    stream = DecodeStream(tokenizer)
    assert stream.fast_path is False
    assert _stream_all(tokenizer, ids) == tokenizer.decode(ids)


def test_prepare_tokenizer_reports_the_path_streams_will_use() -> None:
    from detok_worker.stream import prepare_tokenizer

    assert prepare_tokenizer(load_fixture_tokenizer("qwen3")) is True
    refused = _tiny_byte_level_tokenizer(decoders.Metaspace())
    assert prepare_tokenizer(refused) is False
    assert DecodeStream(refused).fast_path is False
