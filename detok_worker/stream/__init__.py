"""The pure streaming core (no I/O): token ids in, exact text deltas out.

- DecodeStream (decode/): one request's incremental detokenization (generic window diff, or the byte-level fast
  path when the tokenizer's decode is verified to be a byte concatenation; create_decode_stream chooses).
- Sequence: a growing token sequence with its text, built on DecodeStream.
- StopSequenceDecoder, StopRules (stop/): a DecodeStream plus stop tokens and stop strings; the one stop rule.
"""

from detok_worker.stream.decode import (
    DecodeStream,
    byte_decoding_for,
    create_decode_stream,
    fast_path_status,
    prepare_tokenizer,
)
from detok_worker.stream.sequence import Sequence
from detok_worker.stream.stop import (
    Held,
    ParameterError,
    StopBatchOutput,
    StopLimits,
    Stopped,
    StoppedWithText,
    StopRules,
    StopSequenceConfig,
    StopSequenceDecoder,
    Text,
)

__all__ = [
    "DecodeStream",
    "Sequence",
    "Held",
    "StopBatchOutput",
    "ParameterError",
    "StopLimits",
    "StopRules",
    "StopSequenceConfig",
    "StopSequenceDecoder",
    "Stopped",
    "StoppedWithText",
    "Text",
    "byte_decoding_for",
    "create_decode_stream",
    "fast_path_status",
    "prepare_tokenizer",
]
