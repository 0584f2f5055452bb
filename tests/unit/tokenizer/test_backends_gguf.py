"""GGUF backend: GGUF files written with the `gguf` writer from the fixture tokenizers (the layout llama.cpp's
converter uses) rebuild tokenizers with identical ids and text; metadata reader agrees with gguf's own reader."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import mistral_common
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.tokenizer_files import (
    GGUF_PRE_OF_FIXTURE,
    MULTILINGUAL_TEXTS,
    fixture_tokenizer_json,
    gguf_from_byte_level_fixture,
    gguf_from_sentencepiece,
    reference_hf_tokenizer,
)
from tokenizers import Tokenizer

from detok_worker.tokenizer.backends.gguf import read_metadata, tokenizer_parts
from detok_worker.tokenizer.backends.sentencepiece import SentencePieceTokenizer, load_sentencepiece
from detok_worker.tokenizer.protocol import TokenizerLoadError

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
RENDERED = {
    "qwen3": "<|im_start|>user\n你好 🫨<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nok<|im_end|>",
    "deepseek-v3": "<｜begin▁of▁sentence｜>sys<｜User｜>你好 🫨<｜Assistant｜>ok<｜end▁of▁sentence｜>",
    "gpt-oss": "<|start|>user<|message|>你好 🫨<|end|><|start|>assistant<|channel|>final<|message|>ok<|return|>",
}


@pytest.fixture(scope="module", params=sorted(GGUF_PRE_OF_FIXTURE))
def byte_level_case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name = request.param
    path = gguf_from_byte_level_fixture(name, tmp_path_factory.mktemp("gguf") / f"{name}.gguf")
    return name, path


def test_byte_level_gguf_rebuilds_identical_tokenizer(byte_level_case: tuple[str, Path]) -> None:
    name, path = byte_level_case
    parts = tokenizer_parts(read_metadata(path))
    rebuilt = Tokenizer.from_str(parts.tokenizer_json)
    reference = reference_hf_tokenizer(name)
    for text in [*MULTILINGUAL_TEXTS, RENDERED[name]]:
        ids = rebuilt.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode(text, add_special_tokens=False).ids, text
        for skip in (False, True):
            assert rebuilt.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    config = json.loads((FIXTURE_TOKENIZER_DIRS[name] / "tokenizer_config.json").read_text())
    eos = config["eos_token"]["content"] if isinstance(config["eos_token"], dict) else config["eos_token"]
    assert parts.eos_id == reference.token_to_id(eos)
    assert parts.add_bos == bool(config.get("add_bos_token", False))
    if parts.add_bos:
        assert rebuilt.encode("hi").ids[0] == parts.bos_id
    assert parts.chat_template == (
        config.get("chat_template") if isinstance(config.get("chat_template"), str) else None
    )


@pytest.mark.parametrize("model", ["tokenizer.model.v1", "mistral_instruct_tokenizer_240323.model.v3"])
def test_sentencepiece_gguf_gives_the_same_ids_as_the_model_file(model: str, tmp_path: Path) -> None:
    path = gguf_from_sentencepiece(MISTRAL_DATA / model, tmp_path / "spm.gguf")
    parts = tokenizer_parts(read_metadata(path))
    assert parts.sentencepiece_proto is not None
    rebuilt = SentencePieceTokenizer(model_proto=parts.sentencepiece_proto, name=str(path))
    original = load_sentencepiece(MISTRAL_DATA / model)
    for text in [*MULTILINGUAL_TEXTS, "<s>[INST] hi 🫨[/INST] ok</s>"]:
        ids = original.encode(text).ids
        assert rebuilt.encode(text).ids == ids, text
        for skip in (False, True):
            assert rebuilt.decode(ids, skip) == original.decode(ids, skip)
    assert rebuilt.special_tokens == original.special_tokens
    assert rebuilt.eos_token_ids == original.eos_token_ids == frozenset({2})
    assert (parts.bos_id, parts.eos_id, parts.unk_id, parts.add_bos) == (1, 2, 0, True)


def test_metadata_reader_agrees_with_gguf_reader(tmp_path: Path) -> None:
    path = gguf_from_sentencepiece(MISTRAL_DATA / "tokenizer.model.v1", tmp_path / "spm.gguf")
    ours = read_metadata(path)
    theirs = {name: f.contents() for name, f in gguf.GGUFReader(str(path)).fields.items() if name.startswith("tok")}
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if key == "tokenizer.ggml.scores":
            assert ours[key] == pytest.approx(value)
        else:
            assert ours[key] == value, key


def test_embedded_hugging_face_json_is_used_as_is(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(str(tmp_path / "embedded.gguf"), arch="llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_string("tokenizer.huggingface.json", fixture_tokenizer_json("deepseek-v3"))
    writer.add_eos_token_id(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = tokenizer_parts(read_metadata(tmp_path / "embedded.gguf"))
    assert parts.tokenizer_json == fixture_tokenizer_json("deepseek-v3")
    assert parts.eos_id is None  # no token list: ids cannot be checked, so none are trusted


def _small_gguf(path: Path, model: str, pre: str | None = None) -> Path:
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    if pre:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_types([1, 1, 1])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_and_damaged_files_raise_load_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match="'bert' is not supported"):
        tokenizer_parts(read_metadata(_small_gguf(tmp_path / "bert.gguf", "bert")))
    with pytest.raises(TokenizerLoadError, match="pre-tokenizer 'no-such-pre'"):
        tokenizer_parts(read_metadata(_small_gguf(tmp_path / "pre.gguf", "gpt2", "no-such-pre")))
    good = _small_gguf(tmp_path / "good.gguf", "gpt2")
    assert Tokenizer.from_str(tokenizer_parts(read_metadata(good)).tokenizer_json).encode("ab").ids == [2]
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:60])
    with pytest.raises(TokenizerLoadError, match="cannot read GGUF"):
        read_metadata(truncated)
    (tmp_path / "old.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(TokenizerLoadError, match="version 1"):
        read_metadata(tmp_path / "old.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(TokenizerLoadError):
        read_metadata(tmp_path / "empty.gguf")
