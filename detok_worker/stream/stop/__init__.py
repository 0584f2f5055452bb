"""Stop rules of one request: StopRules (rules.py: validated once, the EOS rule, hidden/visible), the stop-string
automaton (matcher.py) and StopSequenceDecoder (decoder.py: a DecodeStream plus stop tokens and stop strings)."""

from detok_worker.stream.stop.decoder import (
    Held,
    StopBatchOutput,
    StopConfigError,
    Stopped,
    StoppedWithText,
    StopSequenceConfig,
    StopSequenceDecoder,
    Text,
)
from detok_worker.stream.stop.rules import DEFAULT_STOP_LIMITS, StopLimits, StopRuleError, StopRules

__all__ = [
    "DEFAULT_STOP_LIMITS",
    "Held",
    "StopBatchOutput",
    "StopConfigError",
    "StopLimits",
    "StopRuleError",
    "StopRules",
    "StopSequenceConfig",
    "StopSequenceDecoder",
    "Stopped",
    "StoppedWithText",
    "Text",
]
