"""Stop rules of one request: StopRules (rules.py: validated once, the EOS rule, hidden/visible), the stop-string
automaton (matcher.py), StopSequenceDecoder (decoder.py: a DecodeStream plus stop tokens and stop strings), what it
returns (outputs.py) and the stop settings it runs (settings.py: StopSequenceConfig, PreparedStops)."""

from detok_worker.errors import ParameterError
from detok_worker.stream.stop.decoder import StopSequenceDecoder
from detok_worker.stream.stop.outputs import Held, StopBatchOutput, Stopped, StoppedWithText, Text
from detok_worker.stream.stop.rules import DEFAULT_STOP_LIMITS, StopLimits, StopRules
from detok_worker.stream.stop.settings import StopSequenceConfig

__all__ = [
    "DEFAULT_STOP_LIMITS",
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
]
