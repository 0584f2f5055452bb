"""TokenizerWrapper: a Tokenizer in front of another (`inner`) that passes the protocol through, for wrappers that
change a few calls (the front's timing of its prompt-side calls, metrics/recorders.py). A wrapper is a
WrapsTokenizer: optional capabilities are asked of its `inner`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from detok_worker.tokenizer.protocol import Encoding, SpecialTokens, Tokenizer


class TokenizerWrapper:
    """The Tokenizer protocol of `inner`, passed through; a subclass overrides what it changes."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def special_tokens(self) -> SpecialTokens:
        return self.inner.special_tokens

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self.inner.special_token_ids

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.inner.eos_token_ids

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        return self.inner.encode(text, add_special_tokens)

    def encode_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.inner.encode_ids(text, add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]:
        return self.inner.encode_batch(texts, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.inner.decode(ids, skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.inner.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        return self.inner.apply_chat_template(messages, **kwargs)
