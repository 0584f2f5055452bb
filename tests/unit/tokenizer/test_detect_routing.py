"""create_tokenizer end to end: every kind of source reaches its backend (by content, whatever the file is called),
forced backends, OpenAI model names through tiktoken's cache, explicit chat templates, and load errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import mistral_common
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.tokenizer_files import (
    fixture_tokenizer_json,
    gguf_from_byte_level_fixture,
    gguf_from_sentencepiece,
    o200k_rank_file_bytes,
    rank_file_bytes,
    reference_hf_tokenizer,
)

from detok_worker.tokenizer import TokenizerLoadError, create_tokenizer
from detok_worker.tokenizer.backends.hf import HFTokenizer
from detok_worker.tokenizer.backends.mistral import TekkenTokenizer
from detok_worker.tokenizer.backends.mock import MockTokenizer
from detok_worker.tokenizer.backends.sentencepiece import SentencePieceTokenizer
from detok_worker.tokenizer.backends.tiktoken import TiktokenTokenizer, tiktoken_cache_file

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
TEXT = "Hello wörld 你好 🫨"


def test_every_file_kind_reaches_its_backend_whatever_its_name(tmp_path: Path) -> None:
    sources = {
        "a.bin": (fixture_tokenizer_json("deepseek-v3").encode(), HFTokenizer),
        "b.dat": ((MISTRAL_DATA / "tokenizer.model.v1").read_bytes(), SentencePieceTokenizer),
        "c.model": ((MISTRAL_DATA / "tekken_240911.json").read_bytes(), TekkenTokenizer),
        "d.json": (rank_file_bytes({bytes([b]): b for b in range(256)}), TiktokenTokenizer),
    }
    for name, (data, backend) in sources.items():
        (tmp_path / name).write_bytes(data)
        tokenizer = create_tokenizer(tmp_path / name)
        assert type(tokenizer) is backend, name
        assert tokenizer.decode(tokenizer.encode(TEXT).ids) == TEXT
    assert (
        create_tokenizer(tmp_path / "a.bin").encode(TEXT).ids
        == reference_hf_tokenizer("deepseek-v3").encode(TEXT, add_special_tokens=False).ids
    )


def test_gguf_files_load_through_the_matching_backend(tmp_path: Path) -> None:
    qwen = create_tokenizer(gguf_from_byte_level_fixture("qwen3", tmp_path / "qwen.bin"))
    reference = create_tokenizer(FIXTURE_TOKENIZER_DIRS["qwen3"])
    assert isinstance(qwen, HFTokenizer)
    assert qwen.encode(TEXT).ids == reference.encode(TEXT).ids
    assert qwen.eos_token_ids == reference.eos_token_ids == frozenset({151645})
    assert qwen.special_tokens.eos == "<|im_end|>"
    messages = [{"role": "user", "content": "hi"}]
    assert qwen.apply_chat_template(messages, add_generation_prompt=True) == reference.apply_chat_template(
        messages, add_generation_prompt=True
    )
    spm = create_tokenizer(gguf_from_sentencepiece(MISTRAL_DATA / "tokenizer.model.v1", tmp_path / "spm.gguf"))
    assert isinstance(spm, SentencePieceTokenizer)
    assert spm.encode(TEXT, add_special_tokens=True).ids[0] == 1


def test_directories_and_vocab_merges(tmp_path: Path) -> None:
    shutil.copy(MISTRAL_DATA / "mistral_instruct_tokenizer_240323.model.v3", tmp_path / "tokenizer.model")
    assert isinstance(create_tokenizer(tmp_path), SentencePieceTokenizer)
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "vocab.json").write_text('{"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4}')
    (gpt2 / "merges.txt").write_text("#version: 0.2\na b\nĠ ab\n")
    tokenizer = create_tokenizer(gpt2)
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.encode("ab ab").ids == [2, 4]
    assert tokenizer.decode([2, 4]) == "ab ab"


def test_openai_model_names_use_tiktoken_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiktoken_cache_file("o200k_base").write_bytes(o200k_rank_file_bytes())
    for name in ("gpt-4o-mini", "o200k_base", "acme-chat"):
        tokenizer = create_tokenizer(name, model_encodings={"acme-*": "o200k_base"})
        assert isinstance(tokenizer, TiktokenTokenizer)
        assert tokenizer.encode("hello world").ids == [24912, 2375]
    with pytest.raises(TokenizerLoadError, match="not cached and offline"):
        create_tokenizer("text-davinci-003")  # p50k_base: no offline copy is installed (cl100k_base has one)


def test_forced_backends_and_explicit_chat_templates(tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token }}")
    spm = create_tokenizer(MISTRAL_DATA / "tokenizer.model.v1", backend="sentencepiece", chat_template=str(template))
    assert spm.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user]hi</s>"
    hf = create_tokenizer(FIXTURE_TOKENIZER_DIRS["mistral-sp-v1"], backend="hf", chat_template=str(template))
    assert hf.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user]hi</s>"
    mock = create_tokenizer("unused", backend="mock", words=["hi"])
    assert isinstance(mock, MockTokenizer) and mock.encode("hi").ids == [256]
    with pytest.raises(TokenizerLoadError, match="unknown tokenizer backend 'nope'"):
        create_tokenizer(FIXTURE_TOKENIZER_DIRS["qwen3"], backend="nope")
    with pytest.raises(TokenizerLoadError, match="holds a hf tokenizer, not sentencepiece"):
        create_tokenizer(FIXTURE_TOKENIZER_DIRS["qwen3"], backend="sentencepiece")
    with pytest.raises(TokenizerLoadError, match="no such file"):
        create_tokenizer("./not/here/tokenizer.json")
