"""The request fields the engine receives, declared once: what each is called, how its value is checked, where it
travels on the bus and which engines take it. The front's checks (front/sampling.py), the gRPC mapper
(engine/grpc_dialects.py) and the vLLM mapper (engine/vllm_requests.py) loop over `FIELDS`.

A field's `name` is vLLM's (its SamplingParams keyword, or the engine core request's) and the bus field's; `param`
is the client's where it differs. Each engine says which fields it does not pass on (EngineStats.refused_fields:
vLLM's engine core takes every one; the gRPC API and detok's own engines lack those with no gRPC field,
`GRPC_REFUSED`); the fronts refuse a request that sets one (a 400 naming it), and the gRPC mapper refuses them too.

Adding a sampling field that vLLM's SamplingParams takes: its row here, the bus field (`SamplingParams` in
bus/messages.py, last, with a default) and the request struct's field (front/openai_api.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from detok_worker.errors import ParameterError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
CACHE_SALT_MAX_CHARS = 128  # vLLM's limit, and the characters it forbids in a salt
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")
VLLM_SOURCE = "vllm"  # the engine source that takes every field (vLLM's engine core)

# how the vLLM mapper passes a field on
VLLM_DEFAULTED = "defaulted"  # by name; unset: the model's generation config's value, as vLLM's server does
VLLM_BY_NAME = "by_name"  # by name, when the value asks for something
VLLM_OWN = "own"  # the mapper's own code (an engine core request field, or read by the source itself)
# how the gRPC mapper passes a field on (None: the gRPC API has no field for it: refused naming it)
GRPC_BY_NAME = "by_name"  # both dialects' SamplingParams field of that name
GRPC_OWN = "own"  # the mapper's own code (a narrower type, or a dialect without it)


def is_set(value: Any) -> bool:
    return value is not None


def truthy(value: Any) -> bool:
    return bool(value)


def other_than(*unset: Any) -> Callable[[Any], bool]:
    return lambda value: value not in unset


@dataclass(frozen=True, slots=True)
class RequestField:
    name: str
    # value (never None) -> the value that travels; raises ParameterError naming the field. None: no check of the
    # value alone (a check that needs more, e.g. the vocabulary, is front/sampling.py's)
    check: Callable[[Any], Any] | None = None
    vllm: str = VLLM_BY_NAME
    grpc: str | None = None
    asks: Callable[[Any], bool] = is_set  # the value asks the engine for something (else it is the default)
    param: str = ""  # the client's name ("": `name`)
    on_request: bool = False  # travels on RequestParams (else on its SamplingParams)
    # its check needs more than its value (the vocabulary, other fields): front/sampling.py's own code sets it
    front_own: bool = False

    @property
    def client_name(self) -> str:
        return self.param or self.name

    def value_of(self, params: Any) -> Any:
        """Its value in a RequestParams."""
        return getattr(params if self.on_request else params.sampling, self.name)


def in_range(name: str, low: float, high: float, low_allowed: bool = True) -> Callable[[float], float]:
    """A float field's check: OpenAI's range, with vLLM's exclusions (`low_allowed` false: must be > low)."""

    def check(value: float) -> float:
        if not (math.isfinite(value) and (low < value or low_allowed and low == value)):
            raise ParameterError(f"{name} must be {'>=' if low_allowed else '>'} {low} (got {value})", name)
        if value > high:
            raise ParameterError(f"{name} must be at most {high} (got {value})", name)
        return value

    return check


def _int64(name: str) -> Callable[[int], int]:
    def check(value: int) -> int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise ParameterError(f"{name} must fit in 64 bits", name)
        return value

    return check


def _top_k(value: int) -> int:
    if not -1 <= value <= INT64_MAX:
        raise ParameterError("top_k must be -1 (off), 0 (off) or a positive number", "top_k")
    return value


def _bad_words(words: list[str]) -> list[str]:
    """vLLM: every word tokenizes to at least one token (it encodes the word without its leading whitespace, so a
    blank one does not); repeated words once, in order."""
    if any(not word.lstrip() for word in words):
        raise ParameterError("bad_words must not contain an empty or blank string", "bad_words")
    return list(dict.fromkeys(words))


def _thinking_token_budget(budget: int) -> int | None:
    """vLLM's rule: a non-negative integer, or -1 (as null) for no limit."""
    if budget == -1:
        return None
    if budget < 0:  # the body's type already refused a non-integer (true, 1.5)
        message = "thinking_token_budget must be a non-negative integer or -1 for unlimited"
        raise ParameterError(message, "thinking_token_budget")
    return budget


def _stream_interval(interval: int) -> int:
    if interval < 1:
        raise ParameterError("stream_interval must be at least 1", "stream_interval")
    return interval


def _cache_salt(salt: str) -> str:
    """vLLM's rule for a cache salt: a non-empty string of at most 128 characters without '@', '/', '\\' or NUL."""
    if not salt or len(salt) > CACHE_SALT_MAX_CHARS or not CACHE_SALT_FORBIDDEN.isdisjoint(salt):
        message = "cache_salt must be a non-empty string of at most 128 characters without '@', '/', '\\' or NUL"
        raise ParameterError(message, "cache_salt")
    return salt


def _float(name: str, low: float, high: float, low_allowed: bool = True) -> RequestField:
    """A float sampling field both gRPC dialects have, which vLLM defaults from the generation config."""
    return RequestField(name, in_range(name, low, high, low_allowed), VLLM_DEFAULTED, GRPC_BY_NAME)


# In the order the front checks them. top_p and repetition_penalty must be > 0 (vLLM's rule; to a gRPC engine a 0
# would also read as "unset").
FIELDS: tuple[RequestField, ...] = (
    _float("temperature", 0.0, 2.0),
    _float("top_p", 0.0, 1.0, low_allowed=False),
    _float("min_p", 0.0, 1.0),
    _float("presence_penalty", -2.0, 2.0),
    _float("frequency_penalty", -2.0, 2.0),
    _float("repetition_penalty", 0.0, 100.0, low_allowed=False),
    RequestField("top_k", _top_k, VLLM_DEFAULTED, GRPC_OWN),
    RequestField("seed", _int64("seed"), grpc=GRPC_OWN),
    RequestField("priority", _int64("priority"), VLLM_OWN, asks=other_than(None, 0), on_request=True),
    RequestField("logit_bias", grpc=GRPC_OWN, asks=truthy, front_own=True),  # ids of the vocabulary
    RequestField("logprobs", grpc=GRPC_OWN, front_own=True),  # completions' count or chat's flag
    RequestField("allowed_token_ids", front_own=True),  # ids of the vocabulary
    RequestField("bad_words", _bad_words, asks=truthy),
    RequestField("prompt_logprobs", front_own=True),  # depends on stream, echo
    RequestField("thinking_token_budget", _thinking_token_budget, asks=other_than(None, -1)),
    # for the engine's custom logits processors
    RequestField("extra_args", lambda extra: extra or None, asks=truthy, param="vllm_xargs"),
    RequestField("stream_interval", _stream_interval, VLLM_OWN),  # read by the vLLM source itself
    RequestField("logprob_token_ids", asks=truthy, front_own=True),  # completions only; needs logprobs
    RequestField("cache_salt", _cache_salt, VLLM_OWN, on_request=True),
    RequestField("session_id", vllm=VLLM_OWN, on_request=True),
)
FIELD_BY_NAME = {field.name: field for field in FIELDS}
SAMPLING_FIELDS = tuple(field for field in FIELDS if not field.on_request)
# the sampling fields whose table check is the whole story: the front sets them in one loop
SAMPLING_CHECKED = tuple(field for field in SAMPLING_FIELDS if not field.front_own)
REQUEST_FIELDS = tuple(field for field in FIELDS if field.on_request)
# what a gRPC engine cannot take: the mapper refuses a request that sets one, naming it; an engine but vLLM's
# announces them as refused (EngineLink's default), and the fronts refuse them
GRPC_REFUSED = tuple(field for field in FIELDS if field.grpc is None)
GRPC_REFUSED_NAMES = tuple(field.name for field in GRPC_REFUSED)
GRPC_FLOATS = tuple(field.name for field in FIELDS if field.grpc == GRPC_BY_NAME)
# what the vLLM mapper passes on by name: (field, whether unset takes the generation config's value)
VLLM_PASSED = tuple((field, field.vllm == VLLM_DEFAULTED) for field in SAMPLING_FIELDS if field.vllm != VLLM_OWN)
