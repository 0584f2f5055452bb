"""Source detection: by file content (wrong extensions on purpose), directory precedence, the OpenAI model-name
routing table (positives, negatives, config extension), module:Class and Hub ids."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

import mistral_common
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.tokenizer_files import fixture_tokenizer_json, rank_file_bytes

from detok_worker.tokenizer.loading.detect import (
    SourceKind,
    detect_directory,
    detect_file,
    detect_source,
    openai_encoding_for,
)
from detok_worker.tokenizer.protocol import TokenizerLoadError

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
SP_MODEL = MISTRAL_DATA / "tokenizer.model.v1"
TEKKEN = MISTRAL_DATA / "tekken_240911.json"
SMALL_RANKS = rank_file_bytes({bytes([b]): b for b in range(256)})


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4o-2024-08-06", "o200k_base"),
        ("chatgpt-4o-latest", "o200k_base"),
        ("o1", "o200k_base"),
        ("o1-preview", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-4.5-preview", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("GPT-4O", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-4-0613", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("gpt-3.5-turbo-16k", "cl100k_base"),
        ("gpt-35-turbo", "cl100k_base"),
        ("text-embedding-ada-002", "cl100k_base"),
        ("text-embedding-3-large", "cl100k_base"),
        ("text-davinci-003", "p50k_base"),
        ("code-davinci-002", "p50k_base"),
        ("text-davinci-edit-001", "p50k_edit"),
        ("davinci", "r50k_base"),
        ("ada", "r50k_base"),
    ],
)
def test_openai_model_names_route_to_tiktoken(model: str, encoding: str) -> None:
    assert openai_encoding_for(model) == encoding
    source = detect_source(model)
    assert (source.kind, source.name) == (SourceKind.TIKTOKEN_NAME, encoding)


@pytest.mark.parametrize(
    "name",
    [
        "openai/gpt-oss-20b",
        "openai/gpt-oss-120b",
        "gpt-oss-20b",
        "ada-lovelace",
        "my-ada",
        "adam",
        "canada",
        "Qwen/Qwen3-8B",
        "o1x",
        "gpt-4oops",
        "org/gpt-4o",
        "mistralai/Mistral-7B-Instruct-v0.3",
    ],
)
def test_other_names_do_not_route_to_tiktoken(name: str) -> None:
    assert openai_encoding_for(name) is None
    assert detect_source(name).kind is SourceKind.HUB


def test_routing_table_extension_from_config() -> None:
    extra = {"my-gpt": "cl100k_base", "acme-*": "o200k_base", "gpt-4": "o200k_base"}
    assert openai_encoding_for("my-gpt", extra) == "cl100k_base"
    assert openai_encoding_for("acme-large-v2", extra) == "o200k_base"
    assert openai_encoding_for("gpt-4", extra) == "o200k_base"  # config overrides the built-in entry
    assert openai_encoding_for("my-gpt") is None
    assert detect_source("acme-x", model_encodings=extra).name == "o200k_base"


def test_encoding_names_python_classes_and_bad_specs() -> None:
    assert detect_source("cl100k_base").kind is SourceKind.TIKTOKEN_NAME
    assert detect_source("o200k_harmony").name == "o200k_harmony"
    assert detect_source("my_pkg.tok:MyTokenizer") == detect_source("my_pkg.tok:MyTokenizer")
    assert detect_source("my_pkg.tok:MyTokenizer").kind is SourceKind.PYTHON
    with pytest.raises(TokenizerLoadError, match="supported files"):
        detect_source("not a tokenizer spec!")


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_files_detected_by_content_not_extension(tmp_path: Path) -> None:
    tokenizer_json = fixture_tokenizer_json("qwen3").encode()
    cases = {
        _write(tmp_path / "tokenizer.bin", tokenizer_json): SourceKind.HF_JSON,
        _write(tmp_path / "bom.model", b"\xef\xbb\xbf\n  " + tokenizer_json): SourceKind.HF_JSON,
        _write(tmp_path / "compressed.dat", lzma.compress(tokenizer_json, preset=0)): SourceKind.HF_JSON,
        _write(tmp_path / "sp.json", SP_MODEL.read_bytes()): SourceKind.SENTENCEPIECE,
        _write(tmp_path / "ranks.model", SMALL_RANKS): SourceKind.TIKTOKEN_FILE,
        _write(tmp_path / "tekken.model", TEKKEN.read_bytes()): SourceKind.TEKKEN,
        _write(tmp_path / "weights.json", b"GGUF\x03\x00\x00\x00" + bytes(32)): SourceKind.GGUF,
    }
    for path, kind in cases.items():
        assert detect_file(path) is kind, path.name
        assert detect_source(path).kind is kind
    for name in sorted(p.name for p in MISTRAL_DATA.glob("*.model*")):
        assert detect_file(MISTRAL_DATA / name) is SourceKind.SENTENCEPIECE, name
    _write(tmp_path / "junk.json", b"\x00\x01binary junk")
    with pytest.raises(TokenizerLoadError, match="not a supported tokenizer"):
        detect_file(tmp_path / "junk.json")


def test_directory_precedence(tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n")
    assert detect_directory(tmp_path).kind is SourceKind.VOCAB_MERGES
    shutil.copy(SP_MODEL, tmp_path / "tokenizer.model")
    assert detect_directory(tmp_path) == detect_source(tmp_path)
    assert detect_directory(tmp_path).kind is SourceKind.SENTENCEPIECE
    _write(tmp_path / "qwen.tiktoken", SMALL_RANKS)
    found = detect_directory(tmp_path)
    assert (found.kind, found.path) == (SourceKind.TIKTOKEN_FILE, tmp_path / "qwen.tiktoken")
    shutil.copy(FIXTURE_TOKENIZER_DIRS["gpt-oss"] / "tokenizer.json.xz", tmp_path / "tokenizer.json.xz")
    assert detect_directory(tmp_path).kind is SourceKind.HF_JSON


def test_llama3_style_tokenizer_model_holding_tiktoken_ranks(tmp_path: Path) -> None:
    _write(tmp_path / "tokenizer.model", SMALL_RANKS)
    found = detect_directory(tmp_path)
    assert (found.kind, found.path) == (SourceKind.TIKTOKEN_FILE, tmp_path / "tokenizer.model")


def test_empty_directory_says_what_was_tried(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError, match=r"tokenizer\.json.*\*\.tiktoken.*tokenizer\.model"):
        detect_directory(tmp_path)
