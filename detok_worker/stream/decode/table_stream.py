"""Base of the fast paths: a DecodeStream driven by a tokenizer's verified ByteDecoding tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from detok_worker.stream.decode.base import DecodeStream
from detok_worker.stream.decode.tables import ByteDecoding, DecodeTables
from detok_worker.tokenizer.protocol import Tokenizer

S = TypeVar("S", bound="TableDecodeStream")


class TableDecodeStream(DecodeStream):
    """A subclass decodes one kind of verified table (`byte_fallback` says which) and sets itself up in `_setup`."""

    __slots__ = ("_decoding", "_texts")
    fast_path = True
    byte_fallback: bool = False

    @classmethod
    def open(
        cls: type[S], tokenizer: Tokenizer, decoding: ByteDecoding, prompt_ids: Sequence[int], skip_special_tokens: bool
    ) -> S:
        """A stream on these verified tables (the factory's way in; verify.py uses it on tables under test)."""
        stream = object.__new__(cls)
        stream.tokenizer = tokenizer
        stream.skip_special_tokens = skip_special_tokens
        tables = decoding.tables(skip_special_tokens)
        stream._decoding = decoding
        stream._texts = tables.texts
        stream._setup(tables, prompt_ids)
        return stream

    def _setup(self, tables: DecodeTables, prompt_ids: Sequence[int]) -> None:
        """The subclass's own state, from `tables` and the prompt (tokenizer, skip flag, decoding, texts are set)."""
        raise NotImplementedError
