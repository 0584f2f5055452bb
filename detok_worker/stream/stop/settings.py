"""A request's stop settings, checked once: StopSequenceConfig (stop tokens and strings, hidden and visible) and
PreparedStops (checked against a tokenizer, shared by the decoders of many requests). StopSequenceDecoder
(decoder.py) runs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from detok_worker.errors import ParameterError
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, is_count, validate_token_ids

# The checks of one request's stop fields, each written once: StopRules.from_params runs them on a request's params
# (front, engine, worker), StopSequenceConfig and StopSequenceDecoder on their own arguments.


def check_stop_string(value: object, param: str) -> str:
    """A stop string: a non-empty str."""
    if not isinstance(value, str):
        raise ParameterError(f"{param} holds {value!r}, which is not a string", param)
    if not value:
        raise ParameterError("stop strings must not be empty", param)
    return value


def check_stop_token_id(value: object, param: str) -> int:
    """A stop token id: an int >= 0 (not a bool); whether it names a token is the tokenizer's rule (PreparedStops)."""
    if not is_count(value):
        raise ParameterError(f"stop token id {value!r} is not a token id (an int >= 0)", param)
    return value  # type: ignore[return-value]


def check_min_tokens(value: object) -> int:
    if not is_count(value):
        raise ParameterError(f"min_tokens must be an int >= 0 (got {value!r})", "min_tokens")
    return value  # type: ignore[return-value]


def _unique_strings(values: Iterable[str], field: str) -> tuple[str, ...]:
    if isinstance(values, str):
        raise ParameterError(f"{field} must be a sequence of strings, not a single string")
    return tuple(dict.fromkeys(check_stop_string(value, field) for value in values))


def _unique_ids(values: Iterable[int], field: str) -> tuple[int, ...]:
    return tuple(dict.fromkeys(check_stop_token_id(value, field) for value in values))


@dataclass(frozen=True, slots=True)
class StopSequenceConfig:
    """Stop tokens and stop strings of one request; hidden ones are cut from the output, visible ones kept.

    Duplicates are dropped; an empty stop string, a non-int token id or an entry that is both hidden and visible
    raises ParameterError.
    """

    stop_tokens: tuple[int, ...] = ()
    stop_sequences: tuple[str, ...] = ()
    visible_stop_tokens: tuple[int, ...] = ()
    visible_stop_sequences: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        normalized = {
            "stop_tokens": _unique_ids(self.stop_tokens, "stop_tokens"),
            "stop_sequences": _unique_strings(self.stop_sequences, "stop_sequences"),
            "visible_stop_tokens": _unique_ids(self.visible_stop_tokens, "visible_stop_tokens"),
            "visible_stop_sequences": _unique_strings(self.visible_stop_sequences, "visible_stop_sequences"),
        }
        for name, value in normalized.items():
            object.__setattr__(self, name, value)
        if both := set(self.stop_tokens) & set(self.visible_stop_tokens):
            raise ParameterError(f"stop tokens {sorted(both)} are listed as both hidden and visible")
        if both := set(self.stop_sequences) & set(self.visible_stop_sequences):
            raise ParameterError(f"stop strings {sorted(both)} are listed as both hidden and visible")


@dataclass(frozen=True, slots=True)
class PreparedStops:
    """A StopSequenceConfig checked against a tokenizer (its stop token ids name tokens of it), with the sets every
    decoder of it reads. Immutable: the decoders of many requests may share one (a worker keeps them per stop
    settings, worker/open_plans.py); each decoder keeps its own stream and stop-string state."""

    tokenizer: Tokenizer
    config: StopSequenceConfig
    stop_tokens: frozenset[int]  # hidden and visible
    visible_stop_tokens: frozenset[int]

    @classmethod
    def check(cls, tokenizer: Tokenizer, config: StopSequenceConfig) -> PreparedStops:
        """Raises ParameterError for a stop token id that names no token of `tokenizer`."""
        try:
            validate_token_ids(tokenizer, (*config.stop_tokens, *config.visible_stop_tokens))
        except InvalidTokenIdError as error:
            raise ParameterError(f"stop token id {error.token_id} names no token of this tokenizer") from error
        visible = frozenset(config.visible_stop_tokens)
        return cls(tokenizer, config, frozenset(config.stop_tokens) | visible, visible)
