"""Reading the Hugging Face side files that sit next to a tokenizer: tokenizer_config.json,
special_tokens_map.json and generation_config.json.

Backends that are not `tokenizer.json` based (tiktoken rank files, SentencePiece models, custom Python tokenizers)
take their named special tokens, extra added tokens, BOS/EOS policy and EOS ids from these files when present.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.protocol import SPECIAL_TOKEN_ROLES, SpecialTokens, TokenizerLoadError, is_int_id


@dataclass(frozen=True)
class AddedToken:
    content: str
    special: bool


@dataclass(frozen=True)
class SideConfig:
    """What the side files say, with token contents normalised to plain strings."""

    named: dict[str, str] = field(default_factory=dict)  # role ("bos", "eos", ...) -> token text
    added_tokens: dict[int, AddedToken] = field(default_factory=dict)
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    generation_eos_ids: tuple[int, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, an AddedToken dict, or null."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def read_json_file(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path` (None when there is no such file); TokenizerLoadError when it holds none."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path} does not hold a JSON object")
    return data


def json_ids(value: Any) -> tuple[int, ...]:
    """A config's token id field (generation_config.json's eos_token_id: one id or a list of them) as ids; what is
    not an id is left out."""
    if is_int_id(value):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if is_int_id(v))
    return ()


def read_side_config(directory: Path | None) -> SideConfig:
    """Read the side files of `directory` (missing files count as empty)."""
    if directory is None:
        return SideConfig()
    raw = {
        **(read_json_file(directory / "special_tokens_map.json") or {}),
        **(read_json_file(directory / "tokenizer_config.json") or {}),
    }
    roles = ((role, token_text(raw.get(f"{role}_token"))) for role in SPECIAL_TOKEN_ROLES)
    named = {role: text for role, text in roles if text is not None}
    added_tokens = {}
    for key, value in (raw.get("added_tokens_decoder") or {}).items():
        text = token_text(value)
        if text is not None and str(key).isdigit():
            added_tokens[int(key)] = AddedToken(text, bool(value.get("special", False)))
    generation_config = read_json_file(directory / "generation_config.json") or {}
    add_bos = raw.get("add_bos_token")
    add_eos = raw.get("add_eos_token")
    return SideConfig(
        named=named,
        added_tokens=added_tokens,
        add_bos_token=add_bos if isinstance(add_bos, bool) else None,
        add_eos_token=add_eos if isinstance(add_eos, bool) else None,
        generation_eos_ids=json_ids(generation_config.get("eos_token_id")),
        raw=raw,
    )


def build_special_tokens(named: dict[str, str], special_texts: set[str]) -> SpecialTokens:
    """SpecialTokens from the named roles plus every other special token text (sorted, for a stable order)."""
    additional = tuple(sorted(special_texts - set(named.values())))
    return SpecialTokens(**{role: named.get(role) for role in SPECIAL_TOKEN_ROLES}, additional=additional)
