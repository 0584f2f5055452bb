"""GGUF backend: rebuild a model file's tokenizer from its `tokenizer.ggml.*` metadata (extra: detok[gguf]).

Only the key/value section is read, by the small reader below (memory-mapped; tensors are never touched). The
`gguf` package's GGUFReader gives the same values (the tests check it) but parses every field into numpy views:
2.9 s instead of 0.13 s for SmolLM2's 49k-token vocabulary, paid by the front and by every worker at start-up.
The result is equivalent to the tokenizer the GGUF was converted from (HF backend; SentencePiece for `llama`):
- an embedded `tokenizer.huggingface.json` is used as is;
- `gpt2` models (byte-level BPE: Qwen, DeepSeek, Llama-3, gpt-oss, ...): vocabulary and merges from the file, the
  split regexes chosen by `tokenizer.ggml.pre` through PRE_TOKENIZERS (llama.cpp's names; a data table);
- `llama` models (SentencePiece BPE with byte fallback: Llama-2, Mistral, Gemma, ...): a SentencePiece model
  rebuilt from the pieces, scores and types (a byte without a `<0xXX>` piece uses its character's piece, as in
  llama.cpp);
- token types: CONTROL tokens are special added tokens, USER_DEFINED ones non-special added tokens.
BOS/EOS/UNK/PAD ids, add_bos/add_eos and the chat template come from the same metadata.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.backends.hf import bpe_document
from detok_worker.tokenizer.backends.sentencepiece import model_proto_class
from detok_worker.tokenizer.backends.tiktoken import TIKTOKEN_PATTERNS
from detok_worker.tokenizer.protocol import TokenizerLoadError

_DEEPSEEK_V3_SPLITS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+""",
]


@dataclass(frozen=True)
class PreTokenizerSpec:
    """How a byte-level BPE splits text before merging: regexes applied in turn (each keeps matches and the text
    between them as pieces, like llama.cpp's regex list), then GPT-2's own regex if `gpt2_split`; an optional
    normalizer; whether a pre-token found whole in the vocabulary skips the merges (tiktoken-style)."""

    splits: tuple[str, ...] = ()
    gpt2_split: bool = False
    normalizer: str | None = None
    ignore_merges: bool = False


_GPT2 = PreTokenizerSpec(gpt2_split=True)
# Every digit alone, then GPT-2's regex (llama.cpp's STARCODER group; SmolLM's tokenizer.json: Digits + ByteLevel).
_DIGITS_THEN_GPT2 = PreTokenizerSpec((r"\p{N}",), gpt2_split=True)

# tokenizer.ggml.pre (llama.cpp's names) -> pre-tokenizer.
PRE_TOKENIZERS: dict[str, PreTokenizerSpec] = {
    "default": _GPT2,
    "gpt-2": _GPT2,
    "starcoder": _DIGITS_THEN_GPT2,
    "smollm": _DIGITS_THEN_GPT2,
    "qwen2": PreTokenizerSpec((TIKTOKEN_PATTERNS["qwen"],), normalizer="NFC"),
    "deepseek-v3": PreTokenizerSpec(tuple(_DEEPSEEK_V3_SPLITS)),
    "llama-bpe": PreTokenizerSpec((TIKTOKEN_PATTERNS["llama3"],), ignore_merges=True),
    "gpt-4o": PreTokenizerSpec((TIKTOKEN_PATTERNS["o200k"],), ignore_merges=True),
    "kimi-k2": PreTokenizerSpec((TIKTOKEN_PATTERNS["kimi"],)),
}
SUPPORTED_MODELS = ("gpt2", "llama")
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


@dataclass
class GGUFTokenizerParts:
    """What the metadata describes: a tokenizer.json document plus what lives beside it in HF repos."""

    tokenizer_json: str
    bos_id: int | None = None
    eos_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None
    token_texts: list[str] = field(default_factory=list)
    sentencepiece_proto: bytes | None = None  # set instead of tokenizer_json for `llama` (SPM) vocabularies


_SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_WANTED_PREFIX = "tokenizer."


class _MetadataReader:
    """Reads the key/value section of a GGUF file (v2/v3, either byte order) without touching tensors."""

    def __init__(self, data: memoryview, order: str) -> None:
        self.data = data
        self.order = order
        self.position = 0

    def unpack(self, fmt: str, count: int = 1) -> tuple[Any, ...]:
        layout = struct.Struct(f"{self.order}{count}{fmt}")
        values = layout.unpack_from(self.data, self.position)
        self.position += layout.size
        return values

    def string(self) -> str:
        (length,) = self.unpack("Q")
        start = self.position
        self.position += length
        if self.position > len(self.data):
            raise ValueError("string runs past the end of the file")
        return bytes(self.data[start : self.position]).decode("utf-8", errors="replace")

    def value(self, value_type: int, keep: bool) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])[0]
        if value_type == _STRING:
            return self.string()
        if value_type != _ARRAY:
            raise ValueError(f"unknown GGUF value type {value_type}")
        element_type, count = self.unpack("I")[0], self.unpack("Q")[0]
        if element_type in _SCALAR_FORMATS:
            size = struct.calcsize(_SCALAR_FORMATS[element_type])
            if not keep:
                self.position += size * count
                return None
            return list(self.unpack(_SCALAR_FORMATS[element_type], count))
        return [self.value(element_type, keep) for _ in range(count)]


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The `tokenizer.*` key/values of a GGUF file (other keys are skipped)."""
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return _parse_metadata(view)
            finally:
                view.release()
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"cannot read GGUF metadata from {path}: {exc}") from exc


def _parse_metadata(data: memoryview) -> dict[str, Any]:
    if bytes(data[:4]) != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    order = "<" if struct.unpack_from("<I", data, 4)[0] < 0x10000 else ">"
    reader = _MetadataReader(data, order)
    reader.position = 4
    (version,) = reader.unpack("I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported (2 or later)")
    _, kv_count = reader.unpack("Q", 2)
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = reader.string()
        (value_type,) = reader.unpack("I")
        keep = key.startswith(_WANTED_PREFIX)
        value = reader.value(value_type, keep)
        if keep:
            metadata[key] = value
    return metadata


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "id": token_id,
            "content": tokens[token_id],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == _CONTROL,
        }
        for token_id, kind in enumerate(types)
        if kind in (_CONTROL, _USER_DEFINED, _UNKNOWN)
    ]


def _byte_level_document(meta: dict[str, Any], tokens: list[str], types: list[int], post: dict[str, Any] | None) -> str:
    pre_name = meta.get("tokenizer.ggml.pre", "default")
    spec = PRE_TOKENIZERS.get(pre_name)
    if spec is None:
        raise TokenizerLoadError(
            f"GGUF pre-tokenizer {pre_name!r} is not supported (supported: {', '.join(PRE_TOKENIZERS)}); "
            "add it to detok_worker.tokenizer.backends.gguf.PRE_TOKENIZERS"
        )
    merges = meta.get("tokenizer.ggml.merges")
    if not merges:
        raise TokenizerLoadError("GGUF byte-level BPE tokenizer has no tokenizer.ggml.merges")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": spec.gpt2_split}
    splits = [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False} for regex in spec.splits
    ]
    return bpe_document(
        {token: token_id for token_id, token in enumerate(tokens)},
        [merge.split(" ", 1) for merge in merges],
        normalizer={"type": spec.normalizer} if spec.normalizer else None,
        pre_tokenizer={"type": "Sequence", "pretokenizers": [*splits, byte_level]},
        decoder={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        added_tokens=_added_tokens(tokens, types),
        post_processor=post,
        ignore_merges=spec.ignore_merges,
        fuse_unk=False,
    )


def _with_all_byte_pieces(tokens: list[str], types: list[int]) -> tuple[list[str], list[int]]:
    """Piece names and types in which all 256 `<0xXX>` byte pieces exist, as SentencePiece's byte fallback
    requires. A vocabulary may lack one (Gemma's has a plain tab instead of <0x09>): llama.cpp then encodes and
    decodes that byte with the piece that is the byte's character, so that piece becomes the byte piece (same id,
    same text)."""
    byte_ids = {token: token_id for token_id, token in enumerate(tokens) if types[token_id] == _BYTE}
    missing = [value for value in range(256) if f"<0x{value:02X}>" not in byte_ids]
    if not missing:
        return tokens, types
    names, kinds = list(tokens), list(types)
    ids = {token: token_id for token_id, token in enumerate(tokens)}
    for value in missing:
        token_id = ids.get(chr(value)) if value < 0x80 else None
        if token_id is None:
            absent = ", ".join(f"<0x{value:02X}>" for value in missing)
            raise TokenizerLoadError(f"GGUF `llama` vocabulary has no piece for byte(s) {absent}")
        names[token_id], kinds[token_id] = f"<0x{value:02X}>", _BYTE
    return names, kinds


def sentencepiece_model_proto(meta: dict[str, Any], tokens: list[str], types: list[int]) -> bytes:
    """A serialized SentencePiece ModelProto (BPE with byte fallback) for a GGUF `llama` vocabulary, so the
    SentencePiece library itself does the encoding, exactly as for the .model the GGUF was made from."""
    model = model_proto_class("gguf")()
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    tokens, types = _with_all_byte_pieces(tokens, types)
    piece_types = set(model.SentencePiece.Type.values())
    for token, score, kind in zip(tokens, scores, types, strict=True):
        # A type SentencePiece does not know reads as its default, NORMAL (what the C++ parser makes of it).
        model.pieces.add(piece=token, score=score, type=kind if kind in piece_types else _NORMAL)
    trainer = model.trainer_spec
    trainer.model_type = trainer.BPE
    trainer.byte_fallback = True
    for spec_field, key in (
        ("unk_id", "unknown_token_id"),
        ("bos_id", "bos_token_id"),
        ("eos_id", "eos_token_id"),
        ("pad_id", "padding_token_id"),
    ):
        value = meta.get(f"tokenizer.ggml.{key}")
        setattr(trainer, spec_field, value if isinstance(value, int) and value >= 0 else -1)
    normalizer = model.normalizer_spec
    normalizer.name = "identity"
    normalizer.add_dummy_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    normalizer.remove_extra_whitespaces = bool(meta.get("tokenizer.ggml.remove_extra_whitespaces", False))
    return model.SerializeToString()


def _post_processor(tokens: list[str], bos: int | None, eos: int | None) -> dict[str, Any] | None:
    if bos is None and eos is None:
        return None
    single: list[dict[str, Any]] = []
    special: dict[str, Any] = {}
    for token_id in (bos, eos):
        if token_id is None:
            continue
        special[tokens[token_id]] = {"id": tokens[token_id], "ids": [token_id], "tokens": [tokens[token_id]]}
    if bos is not None:
        single.append({"SpecialToken": {"id": tokens[bos], "type_id": 0}})
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    if eos is not None:
        single.append({"SpecialToken": {"id": tokens[eos], "type_id": 0}})
    pair = [*single, {"Sequence": {"id": "B", "type_id": 1}}]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}


def _optional_id(meta: dict[str, Any], key: str, n_tokens: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{key}")
    return value if isinstance(value, int) and 0 <= value < n_tokens else None


def tokenizer_parts(meta: dict[str, Any], source: str = "GGUF file") -> GGUFTokenizerParts:
    """Build the tokenizer.json document and side data from `tokenizer.*` metadata."""
    tokens = meta.get("tokenizer.ggml.tokens") or []
    embedded = meta.get("tokenizer.huggingface.json")
    model = meta.get("tokenizer.ggml.model")
    n = len(tokens)
    parts = GGUFTokenizerParts(
        tokenizer_json="",
        bos_id=_optional_id(meta, "bos_token_id", n),
        eos_id=_optional_id(meta, "eos_token_id", n),
        unk_id=_optional_id(meta, "unknown_token_id", n),
        pad_id=_optional_id(meta, "padding_token_id", n),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama")),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
        token_texts=tokens,
    )
    if isinstance(embedded, str) and embedded:
        parts.tokenizer_json = embedded
        return parts
    if model not in SUPPORTED_MODELS or not tokens:
        raise TokenizerLoadError(
            f"{source}: tokenizer model {model!r} is not supported (supported: {', '.join(SUPPORTED_MODELS)}, "
            "or an embedded tokenizer.huggingface.json)"
        )
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * n
    if len(types) != n:
        raise TokenizerLoadError(f"{source}: {len(types)} token types for {n} tokens")
    if model == "llama":
        parts.sentencepiece_proto = sentencepiece_model_proto(meta, tokens, types)
        return parts
    post = _post_processor(tokens, parts.bos_id if parts.add_bos else None, parts.eos_id if parts.add_eos else None)
    parts.tokenizer_json = _byte_level_document(meta, tokens, types, post)
    return parts
