"""Deciding which backend loads a tokenizer source: by content, by directory layout, or by model name.

- Files are recognised by their first bytes, never only by extension: JSON after an optional UTF-8 BOM (a
  Hugging Face tokenizer.json, or a Mistral Tekken file when it holds `token_bytes`), xz-compressed JSON, the GGUF
  magic, a SentencePiece ModelProto, or tiktoken's `base64 rank` lines.
- Directories: tokenizer.json > *.tiktoken (or tiktoken.model) > tokenizer.model > vocab.json + merges.txt >
  tekken.json > a single *.gguf.
- Names: an OpenAI model name routes to its tiktoken encoding through OPENAI_MODEL_ENCODINGS, a data table that
  the config extends (keys are exact names; a key ending in "*" is a prefix, the longest prefix wins). Names
  with a "/" are Hub ids and never route to tiktoken (`openai/gpt-oss-20b` is a Hub repository); names merely
  containing a known name (e.g. "ada") do not match either. `module:Class` names a Python tokenizer class.
  Anything else is a Hugging Face Hub model id.
"""

from __future__ import annotations

import enum
import lzma
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from detok_worker.tokenizer.protocol import TokenizerLoadError


class SourceKind(str, enum.Enum):
    HF_JSON = "hf"  # tokenizer.json (optionally .xz) or a directory holding one
    VOCAB_MERGES = "vocab-merges"  # GPT-2 style vocab.json + merges.txt directory
    TIKTOKEN_FILE = "tiktoken"  # a *.tiktoken rank file
    TIKTOKEN_NAME = "tiktoken-name"  # a named tiktoken encoding (o200k_base, ...)
    SENTENCEPIECE = "sentencepiece"  # a SentencePiece .model
    TEKKEN = "tekken"  # a Mistral Tekken .json (through mistral-common)
    GGUF = "gguf"  # a GGUF model file (tokenizer metadata only)
    PYTHON = "python"  # module:Class
    HUB = "hub"  # a Hugging Face Hub model id


@dataclass(frozen=True)
class TokenizerSource:
    """What to load and with which backend. `path` is the file (or, for HF_JSON/VOCAB_MERGES, the file or
    directory); `name` the encoding, class or Hub id."""

    kind: SourceKind
    path: Path | None = None
    name: str | None = None


def _all_to(encoding: str, *names: str) -> dict[str, str]:
    return {name: encoding for name in names}


# OpenAI model name -> tiktoken encoding. Exact keys, or prefixes ending in "*".
OPENAI_MODEL_ENCODINGS: dict[str, str] = {
    **_all_to(
        "o200k_base",
        *("gpt-5", "gpt-5-*", "gpt-5.*", "gpt-4.1", "gpt-4.1-*", "gpt-4.5", "gpt-4.5-*", "gpt-4o", "gpt-4o-*"),
        *("chatgpt-4o-*", "o1", "o1-*", "o3", "o3-*", "o4-mini", "o4-mini-*", "ft:gpt-4o*"),
    ),
    **_all_to(
        "cl100k_base",
        *("gpt-4", "gpt-4-*", "gpt-3.5", "gpt-3.5-turbo", "gpt-3.5-turbo-*", "gpt-35-turbo", "gpt-35-turbo-*"),
        *("ft:gpt-4-*", "ft:gpt-3.5-turbo*", "davinci-002", "babbage-002", "ft:davinci-002*", "ft:babbage-002*"),
        *("text-embedding-ada-002", "text-embedding-3-small", "text-embedding-3-large"),
    ),
    **_all_to(
        "p50k_base",
        *("text-davinci-003", "text-davinci-002", "code-davinci-002", "code-davinci-001", "code-cushman-002"),
        *("code-cushman-001", "davinci-codex", "cushman-codex"),
    ),
    **_all_to("p50k_edit", "text-davinci-edit-001", "code-davinci-edit-001"),
    **_all_to(
        "r50k_base",
        *("text-davinci-001", "text-curie-001", "text-babbage-001", "text-ada-001"),
        *("davinci", "curie", "babbage", "ada"),
    ),
    **_all_to("gpt2", "gpt2", "gpt-2"),
}

_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+={0,2} \d+\r?$")
_PYTHON_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
_BOM = b"\xef\xbb\xbf"
_XZ_MAGIC = b"\xfd7zXZ\x00"
_HEAD_BYTES = 1 << 16
# Field 1's tag (length-delimited: 0x0A), a length varint that is not zero (0x80 bytes then 0x00), field 1's tag.
_SENTENCEPIECE_START = re.compile(rb"\x0a(?!\x80*\x00)[\x80-\xff]{0,9}[\x00-\x7f]\x0a")


def openai_encoding_for(model: str, extra: Mapping[str, str] | None = None) -> str | None:
    """The tiktoken encoding of an OpenAI model name, or None (Hub ids with "/" never match)."""
    name = model.strip().lower()
    if not name or "/" in name:
        return None
    table = {**OPENAI_MODEL_ENCODINGS, **{k.lower(): v for k, v in (extra or {}).items()}}
    if name in table:
        return table[name]
    best: tuple[int, str] | None = None
    for key, encoding in table.items():
        if key.endswith("*") and name.startswith(key[:-1]) and (best is None or len(key) > best[0]):
            best = (len(key), encoding)
    return best[1] if best else None


def _read_head(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    if head.startswith(_XZ_MAGIC):
        decompressor = lzma.LZMADecompressor()
        try:
            with path.open("rb") as handle:
                return decompressor.decompress(handle.read(_HEAD_BYTES * 4), max_length=_HEAD_BYTES)
        except lzma.LZMAError as exc:
            raise TokenizerLoadError(f"{path} looks xz-compressed but cannot be decompressed: {exc}") from exc
    return head


def detect_file(path: str | Path) -> SourceKind:
    """The kind of a tokenizer file, from its content; TokenizerLoadError if it is none we support."""
    path = Path(path)
    head = _read_head(path)
    if head.startswith(b"GGUF"):
        return SourceKind.GGUF
    body = head.removeprefix(_BOM).lstrip()
    if body.startswith(b"{"):
        tekken = b'"token_bytes"' in body or b'"default_num_special_tokens"' in body
        return SourceKind.TEKKEN if tekken else SourceKind.HF_JSON
    first_line = body.split(b"\n", 1)[0]
    if _TIKTOKEN_LINE.match(first_line):
        return SourceKind.TIKTOKEN_FILE
    # a ModelProto starts with field 1 (a SentencePiece message, non-empty) whose own field 1 is the piece string:
    # a byte signature, so detection needs neither protobuf nor sentencepiece
    if len(head) >= 4 and _SENTENCEPIECE_START.match(head) is not None:
        return SourceKind.SENTENCEPIECE
    raise TokenizerLoadError(
        f"{path}: not a supported tokenizer file (supported: tokenizer.json / Tekken JSON, xz-compressed JSON, "
        "GGUF, a SentencePiece model, a tiktoken rank file)"
    )


def detect_directory(directory: str | Path) -> TokenizerSource:
    """The tokenizer a directory holds, by the precedence in the module docstring."""
    directory = Path(directory)
    for name in ("tokenizer.json", "tokenizer.json.xz"):
        if (directory / name).is_file():
            return TokenizerSource(SourceKind.HF_JSON, directory)
    rank_files = sorted(directory.glob("*.tiktoken")) or [p for p in [directory / "tiktoken.model"] if p.is_file()]
    if rank_files:
        return TokenizerSource(SourceKind.TIKTOKEN_FILE, rank_files[0])
    model = directory / "tokenizer.model"
    if model.is_file():
        return TokenizerSource(detect_file(model), model)  # Llama-3 ships tiktoken ranks under this name
    if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        return TokenizerSource(SourceKind.VOCAB_MERGES, directory)
    tekken = directory / "tekken.json"
    if tekken.is_file():
        return TokenizerSource(SourceKind.TEKKEN, tekken)
    ggufs = sorted(directory.glob("*.gguf"))
    if len(ggufs) == 1:
        return TokenizerSource(SourceKind.GGUF, ggufs[0])
    raise TokenizerLoadError(
        f"no tokenizer found in directory {directory} (looked for tokenizer.json[.xz], *.tiktoken, tiktoken.model, "
        "tokenizer.model, vocab.json + merges.txt, tekken.json, a single *.gguf)"
    )


def _looks_like_path(spec: str) -> bool:
    """Specs that can only mean a local path (Hub ids are `name` or `org/name`)."""
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec or spec.endswith(_FILE_SUFFIXES)


_FILE_SUFFIXES = (".json", ".xz", ".model", ".tiktoken", ".gguf", ".txt")


def detect_source(name_or_path: str | Path, model_encodings: Mapping[str, str] | None = None) -> TokenizerSource:
    """Route a user-given tokenizer spec to a backend (see the module docstring for the order)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return detect_directory(path)
    if path.is_file():
        kind = detect_file(path)
        return TokenizerSource(kind, path)
    spec = str(name_or_path).strip()
    if _looks_like_path(spec):
        raise TokenizerLoadError(f"{path}: no such file or directory")
    import tiktoken

    if spec in tiktoken.list_encoding_names():
        return TokenizerSource(SourceKind.TIKTOKEN_NAME, name=spec)
    encoding = openai_encoding_for(spec, model_encodings)
    if encoding is not None:
        return TokenizerSource(SourceKind.TIKTOKEN_NAME, name=encoding)
    if _PYTHON_CLASS.match(spec):
        return TokenizerSource(SourceKind.PYTHON, name=spec)
    if _HUB_ID.match(spec):
        return TokenizerSource(SourceKind.HUB, name=spec)
    raise TokenizerLoadError(
        f"{spec!r} is not an existing file or directory, a tiktoken encoding, a known OpenAI model name, a "
        "module:Class or a Hub model id (org/name); supported files: tokenizer.json[.xz], *.tiktoken, "
        "SentencePiece .model, Tekken .json, .gguf, or a directory holding one"
    )
