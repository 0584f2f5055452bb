"""Where the tests' files are: the repo, and the real tokenizer files kept in it (no network at test time)."""

from __future__ import annotations

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

_loaded: dict[str, object] = {}


def load_fixture_tokenizer(name: str):
    """Load (once per test session) a fixture tokenizer through the public factory."""
    if name not in _loaded:
        from detok_worker.tokenizer import create_tokenizer

        _loaded[name] = create_tokenizer(str({**FIXTURE_TOKENIZER_DIRS, **TEXT_DECODER_FIXTURE_DIRS}[name]))
    return _loaded[name]
