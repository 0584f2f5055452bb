"""Where the tests' files are: the repo, and the real tokenizer files kept in it (no network at test time)."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURE_ROOT = REPO / "tests" / "fixtures" / "tokenizers"
# name -> directory holding tokenizer.json.xz + tokenizer_config.json: the generation tokenizers (ByteLevel BPE or
# SentencePiece byte fallback), on which every parametrised test runs (sources: fixtures/tokenizers/LICENSES.md).
FIXTURE_TOKENIZER_DIRS: dict[str, Path] = {
    "qwen3": REPO / "detok_worker" / "tokenizer" / "data" / "qwen3",
    "deepseek-v3": FIXTURE_ROOT / "deepseek-v3",
    "gpt-oss": FIXTURE_ROOT / "gpt-oss",
    "mistral-sp-v1": FIXTURE_ROOT / "mistral-sp-v1",
    "gpt4o": FIXTURE_ROOT / "gpt4o",
    "gpt35turbo": FIXTURE_ROOT / "gpt35turbo",
    "claude": FIXTURE_ROOT / "claude",
}
# Tokenizers whose decoder has no byte semantics (WordPiece joins words with spaces): the byte-accounting oracle of
# the streaming tests does not model them, so they have their own tests (unit/tokenizer/test_streaming_wordpiece.py).
TEXT_DECODER_FIXTURE_DIRS: dict[str, Path] = {"bert-wordpiece": FIXTURE_ROOT / "bert-wordpiece"}

# Families whose tokenizer is not available offline: name -> (the fixture it is built on, the family's markers and
# end-of-turn tokens, added to it as special tokens). Their recorded outputs are the family's text on that vocabulary;
# built once per machine (marked_fixture_dir), outside the repo.
MARKED_FIXTURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "glm-markers": (  # GLM-4.5 to 4.7: the tool-call and turn markers are special tokens of its vocabulary
        "deepseek-v3",
        ("<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
         "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    ),
    "minimax-markers": (  # MiniMax-M2
        "deepseek-v3",
        ("[e~[", "]~b]", "<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"),
    ),
    "kimi-markers": (  # Kimi-K2
        "deepseek-v3",
        ("<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<think>", "</think>",
         "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
         "<|tool_call_argument_begin|>", "<|tool_call_end|>"),
    ),
}  # fmt: skip

_loaded: dict[str, object] = {}


def fixture_dir(name: str) -> Path:
    """The directory of a fixture tokenizer, a marked one included."""
    if name in MARKED_FIXTURES:
        return marked_fixture_dir(name)
    return {**FIXTURE_TOKENIZER_DIRS, **TEXT_DECODER_FIXTURE_DIRS}[name]


def marked_fixture_dir(name: str) -> Path:
    """A MARKED_FIXTURES tokenizer: its base's tokenizer.json with the markers appended as special tokens (new ids
    after the base's last), and the base's tokenizer_config.json."""
    base, markers = MARKED_FIXTURES[name]
    source = FIXTURE_ROOT / base
    key = hashlib.sha256(json.dumps([name, markers]).encode() + (source / "tokenizer.json.xz").read_bytes()).hexdigest()
    folder = Path(tempfile.gettempdir()) / "detok-test-fixtures" / f"{name}-{key[:16]}"
    if (folder / "tokenizer.json").is_file():
        return folder
    document = json.loads(lzma.decompress((source / "tokenizer.json.xz").read_bytes()))
    next_id = 1 + max([*document["model"]["vocab"].values(), *(token["id"] for token in document["added_tokens"])])
    for offset, marker in enumerate(markers):
        document["added_tokens"].append(
            {"id": next_id + offset, "content": marker, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        )  # fmt: skip
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))
    (staging / "tokenizer.json").write_text(json.dumps(document, ensure_ascii=False))
    (staging / "tokenizer_config.json").write_text((source / "tokenizer_config.json").read_text())
    try:
        os.rename(staging, folder)
    except OSError:  # another process built it first
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def load_fixture_tokenizer(name: str):
    """Load (once per test session) a fixture tokenizer through the public factory."""
    if name not in _loaded:
        from detok_worker.tokenizer import create_tokenizer

        _loaded[name] = create_tokenizer(str(fixture_dir(name)))
    return _loaded[name]
