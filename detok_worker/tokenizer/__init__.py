"""Tokenizers: the protocol the rest of detok depends on, and the factory that loads a backend for a path.

The protocol and its errors are imported with the package; the rest (the backends, `tokenizers`, jinja2, the
encode cache) on first use of its name, so a process that only needs the protocol (the supervisor, the CLI's
argument parsing) does not pay for importing them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from detok_worker.tokenizer.protocol import (
    Encoding,
    InvalidTokenIdError,
    SpecialTokens,
    Tokenizer,
    TokenizerError,
    TokenizerLoadError,
)

if TYPE_CHECKING:
    from detok_worker.tokenizer.encode_cache import CachedTokenizer
    from detok_worker.tokenizer.loading.factory import (
        DEFAULT_TOKENIZER_DIR,
        create_tokenizer,
        load_configured_tokenizer,
        load_default_tokenizer,
    )
    from detok_worker.tokenizer.token_bytes import TokenBytesTable

_LAZY_NAMES = {
    "CachedTokenizer": "detok_worker.tokenizer.encode_cache",
    "DEFAULT_TOKENIZER_DIR": "detok_worker.tokenizer.loading.factory",
    "create_tokenizer": "detok_worker.tokenizer.loading.factory",
    "load_configured_tokenizer": "detok_worker.tokenizer.loading.factory",
    "load_default_tokenizer": "detok_worker.tokenizer.loading.factory",
    "TokenBytesTable": "detok_worker.tokenizer.token_bytes",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_TOKENIZER_DIR",
    "CachedTokenizer",
    "Encoding",
    "InvalidTokenIdError",
    "SpecialTokens",
    "TokenBytesTable",
    "Tokenizer",
    "TokenizerError",
    "TokenizerLoadError",
    "create_tokenizer",
    "load_configured_tokenizer",
    "load_default_tokenizer",
]
