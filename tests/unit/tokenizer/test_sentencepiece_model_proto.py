"""SentencePiece ModelProto through SentencePiece's own generated class (protobuf): the dummy-prefix edit, the
model rebuilt from GGUF metadata, the error naming the extra when protobuf is missing, and detection of a .model
file that needs neither protobuf nor sentencepiece."""

from __future__ import annotations

import sys
from pathlib import Path

import mistral_common
import pytest
import sentencepiece
from sentencepiece import sentencepiece_model_pb2

from detok_worker.tokenizer.backends.gguf import sentencepiece_model_proto
from detok_worker.tokenizer.backends.sentencepiece import SentencePieceTokenizer, without_dummy_prefix
from detok_worker.tokenizer.loading.detect import SourceKind, detect_file
from detok_worker.tokenizer.protocol import TokenizerLoadError

MODEL_FILE = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
BYTE_PIECES = [f"<0x{value:02X}>" for value in range(256)]


def test_without_dummy_prefix_changes_only_that_flag() -> None:
    original = MODEL_FILE.read_bytes()
    edited = sentencepiece_model_pb2.ModelProto.FromString(without_dummy_prefix(original))
    expected = sentencepiece_model_pb2.ModelProto.FromString(original)
    assert expected.normalizer_spec.add_dummy_prefix is True
    expected.normalizer_spec.add_dummy_prefix = False
    assert edited == expected
    processor = sentencepiece.SentencePieceProcessor(model_proto=without_dummy_prefix(original))
    assert processor.encode_as_pieces("hello world") == ["hello", "▁world"]


def test_gguf_metadata_becomes_a_bpe_byte_fallback_model() -> None:
    tokens = ["<unk>", "<s>", "</s>", *BYTE_PIECES, "▁hi", "odd"]
    types = [2, 3, 3, *[6] * 256, 1, 0]  # 0 is no SentencePiece piece type
    meta = {"tokenizer.ggml.scores": [0.0] * 259 + [-1.5, -2.0], "tokenizer.ggml.bos_token_id": 1}
    model = sentencepiece_model_pb2.ModelProto.FromString(sentencepiece_model_proto(meta, tokens, types))
    assert [piece.piece for piece in model.pieces] == tokens
    assert [piece.type for piece in model.pieces[-3:]] == [6, 1, 1]  # the unknown type reads as NORMAL
    assert model.pieces[-2].score == -1.5
    spec = model.trainer_spec
    assert (spec.model_type, spec.byte_fallback) == (spec.BPE, True)
    assert (spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id) == (-1, 1, -1, -1)
    assert (model.normalizer_spec.name, model.normalizer_spec.add_dummy_prefix) == ("identity", True)
    assert model.normalizer_spec.remove_extra_whitespaces is False


def test_missing_protobuf_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    with pytest.raises(TokenizerLoadError, match=r"pip install 'detok\[sentencepiece\]'"):
        SentencePieceTokenizer(MODEL_FILE)
    with pytest.raises(TokenizerLoadError, match=r"pip install 'detok\[gguf\]'"):
        sentencepiece_model_proto({}, ["<unk>", *BYTE_PIECES], [2, *[6] * 256])


def test_detecting_a_model_file_needs_no_protobuf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for module in ("google.protobuf", "sentencepiece", "sentencepiece.sentencepiece_model_pb2"):
        monkeypatch.setitem(sys.modules, module, None)
    renamed = tmp_path / "weights.bin"
    renamed.write_bytes(MODEL_FILE.read_bytes())
    assert detect_file(renamed) is SourceKind.SENTENCEPIECE
    empty_first_piece = tmp_path / "empty.bin"
    empty_first_piece.write_bytes(b"\x0a\x80\x00\x0a\x01a")  # field 1 of length zero (non-minimal varint)
    with pytest.raises(TokenizerLoadError, match="not a supported tokenizer file"):
        detect_file(empty_first_piece)
