"""Tokenizers: the protocol the rest of detok depends on, and the factory that loads a backend for a path."""

from detok_worker.tokenizer.encode_cache import CachedTokenizer
from detok_worker.tokenizer.loading.factory import (
    DEFAULT_TOKENIZER_DIR,
    create_tokenizer,
    load_configured_tokenizer,
    load_default_tokenizer,
)
from detok_worker.tokenizer.protocol import (
    Encoding,
    InvalidTokenIdError,
    SpecialTokens,
    Tokenizer,
    TokenizerError,
    TokenizerLoadError,
)
from detok_worker.tokenizer.token_bytes import TokenBytesTable

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
