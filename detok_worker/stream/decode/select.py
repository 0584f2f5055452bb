"""The factory: which DecodeStream implementation serves a tokenizer, and building one; decode_text, a whole
decode on the same choice.

The byte-level fast path when fast_path.py verified the tokenizer's byte table (byte_level.py for byte-level BPE,
byte_fallback.py for SentencePiece-style byte fallback), else the generic window diff (generic.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from detok_worker.stream.decode.added_tokens import join_added_tokens
from detok_worker.stream.decode.base import DecodeStream, register_factory
from detok_worker.stream.decode.byte_fallback import ByteFallbackDecodeStream
from detok_worker.stream.decode.byte_level import ByteLevelDecodeStream
from detok_worker.stream.decode.fast_path import byte_decoding_for
from detok_worker.stream.decode.generic import GenericDecodeStream, probe_token_for
from detok_worker.tokenizer.protocol import Tokenizer


def create_decode_stream(
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int] = (),
    skip_special_tokens: bool = False,
    *,
    force_generic: bool = False,
    spaces_between_special_tokens: bool = True,
) -> DecodeStream:
    """A stream for one request: the fastest exact implementation for this tokenizer (see base.py's contract).
    `spaces_between_special_tokens` False with special tokens kept: vLLM's rule for it (added_tokens.py)."""
    decoding = None if force_generic else byte_decoding_for(tokenizer)
    if decoding is None:
        stream: DecodeStream = GenericDecodeStream.open(tokenizer, prompt_ids, skip_special_tokens)
    else:
        implementation = ByteFallbackDecodeStream if decoding.byte_fallback else ByteLevelDecodeStream
        stream = implementation.open(tokenizer, decoding, prompt_ids, skip_special_tokens)
    if skip_special_tokens or spaces_between_special_tokens:
        return stream
    return join_added_tokens(stream, tokenizer)


def decode_text(tokenizer: Tokenizer, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """tokenizer.decode(ids, skip_special_tokens): with verified tables, computed as the verification checks it (a
    stream over the ids, then flush) without a call into the tokenizer's library, which a worker whose tables came
    from disk has not built (backends/hf.py defers that); else by the tokenizer's own decode."""
    if byte_decoding_for(tokenizer) is None:
        return tokenizer.decode(ids, skip_special_tokens)
    stream = create_decode_stream(tokenizer, (), skip_special_tokens)
    return "".join(stream.step_batch(ids)) + (stream.flush() or "")


def prepare_tokenizer(tokenizer: Tokenizer) -> bool:
    """Build now what streams of this tokenizer need once (the fast path's verified tables, or else the generic
    path's probe id), so the first request does not pay for it; workers call this at start. Returns whether
    streams of this tokenizer use the fast path."""
    if byte_decoding_for(tokenizer) is not None:
        return True
    probe_token_for(tokenizer)
    return False


register_factory(create_decode_stream)
