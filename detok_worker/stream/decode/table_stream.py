"""Base of the fast paths: a DecodeStream driven by a tokenizer's verified ByteDecoding tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from detok_worker.stream.decode.base import DecodeStream
from detok_worker.stream.decode.tables import ByteDecoding
from detok_worker.tokenizer.protocol import Tokenizer

S = TypeVar("S", bound="TableDecodeStream")


class TableDecodeStream(DecodeStream):
    """A subclass decodes one kind of verified table (`byte_fallback` says which) and sets itself up in `_setup`."""

    __slots__ = ()
    fast_path = True
    byte_fallback: bool = False

    @classmethod
    def open(
        cls: type[S], tokenizer: Tokenizer, decoding: ByteDecoding, prompt_ids: Sequence[int], skip_special_tokens: bool
    ) -> S:
        """A stream on these verified tables (the factory's way in; verify.py uses it on tables under test)."""
        stream = object.__new__(cls)
        stream._setup(tokenizer, decoding, prompt_ids, skip_special_tokens)
        return stream

    def _setup(
        self, tokenizer: Tokenizer, decoding: ByteDecoding, prompt_ids: Sequence[int], skip_special_tokens: bool
    ) -> None:
        raise NotImplementedError
