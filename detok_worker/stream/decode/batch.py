"""decode for several id lists in one call: the backend's decode_batch when it has one (one call into Rust)."""

from __future__ import annotations

from collections.abc import Callable

from detok_worker.tokenizer.protocol import DecodesBatch, Tokenizer

BatchDecode = Callable[[list[list[int]]], list[str]]


def batch_decoder(tokenizer: Tokenizer, skip_special_tokens: bool, *, large: bool = True) -> BatchDecode:
    """A function decoding a list of id lists with this skip_special_tokens setting.

    large=False is for a handful of short lists per call (the generic stream's windows): a parallel decode_batch
    costs more to dispatch (~10 us) than a few plain decode calls."""
    if large and isinstance(tokenizer, DecodesBatch):
        decode_batch = tokenizer.decode_batch
        return lambda sequences: decode_batch(sequences, skip_special_tokens)
    decode = tokenizer.decode
    return lambda sequences: [decode(ids, skip_special_tokens) for ids in sequences]
