"""Incremental detokenization of one request (DecodeStream, base.py): the factory (select.py) picks the byte-level
fast path (tables.py, verify.py, fast_path.py, table_stream.py, byte_level.py, byte_fallback.py) or the generic
window diff (generic.py, byte_tokens.py). utf8.py says which bytes are final; registry.py caches per-tokenizer data.
"""

from detok_worker.stream.decode.base import DecodeStream
from detok_worker.stream.decode.fast_path import FastPathStatus, byte_decoding_for, fast_path_status
from detok_worker.stream.decode.select import create_decode_stream, decode_text, prepare_tokenizer

__all__ = [
    "DecodeStream",
    "FastPathStatus",
    "byte_decoding_for",
    "create_decode_stream",
    "decode_text",
    "fast_path_status",
    "prepare_tokenizer",
]
