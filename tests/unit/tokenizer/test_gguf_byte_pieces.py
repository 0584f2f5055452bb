"""GGUF `llama` vocabularies without all 256 byte pieces (Gemma's has a plain tab where <0x09> would be): llama.cpp
encodes and decodes that byte with the character's own piece, so they load and give the ids and text of the
SentencePiece model they were written from; a missing byte with no such piece is a clear load error."""

from __future__ import annotations

from pathlib import Path

import mistral_common
import pytest
from helpers.tokenizer_files import GGUF_NORMAL, MULTILINGUAL_TEXTS, gguf_from_sentencepiece

from detok_worker.stream import DecodeStream
from detok_worker.tokenizer import create_tokenizer
from detok_worker.tokenizer.backends.sentencepiece import load_sentencepiece
from detok_worker.tokenizer.protocol import TokenizerLoadError

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
MODELS = ["tokenizer.model.v1", "mistral_instruct_tokenizer_240323.model.v3"]
TAB_TEXTS = ["a\tb", "\t\t\tx\t", "def f():\n\treturn 1\t# 你好 🫨", "\t", "col1\tcol2\t\tcol4\n"]


def _byte_piece_id(model: str, value: int) -> int:
    original = load_sentencepiece(MISTRAL_DATA / model)
    token_id = original.token_to_id(f"<0x{value:02X}>")
    assert token_id is not None
    return token_id


@pytest.mark.parametrize("model", MODELS)
def test_a_tab_piece_in_place_of_byte_09_gives_the_model_files_ids_and_text(model: str, tmp_path: Path) -> None:
    tab_id = _byte_piece_id(model, 0x09)
    path = gguf_from_sentencepiece(MISTRAL_DATA / model, tmp_path / "gemma-like.gguf", {tab_id: ("\t", GGUF_NORMAL)})
    rebuilt = create_tokenizer(str(path))
    original = load_sentencepiece(MISTRAL_DATA / model)
    for text in [*TAB_TEXTS, *MULTILINGUAL_TEXTS]:
        ids = original.encode(text).ids
        assert rebuilt.encode(text).ids == ids, text
        assert rebuilt.decode(ids) == original.decode(ids)
        stream = DecodeStream(rebuilt)
        assert "".join(stream.step(token_id) or "" for token_id in ids) == rebuilt.decode(ids)
    assert [rebuilt.decode(original.encode(text).ids) for text in TAB_TEXTS] == TAB_TEXTS
    assert tab_id in rebuilt.encode("a\tb").ids
    assert rebuilt.decode([tab_id, tab_id]) == "\t\t"


@pytest.mark.parametrize("model", MODELS)
def test_a_missing_byte_without_a_character_piece_is_a_load_error(model: str, tmp_path: Path) -> None:
    replaced = _byte_piece_id(model, 0x80)
    path = gguf_from_sentencepiece(MISTRAL_DATA / model, tmp_path / "broken.gguf", {replaced: ("zzq", GGUF_NORMAL)})
    with pytest.raises(TokenizerLoadError, match=r"no piece for byte\(s\) <0x80>"):
        create_tokenizer(str(path))
