"""Request checks shared by both endpoints: everything a client can get wrong becomes a 4xx APIError here,
before any prompt work or bus traffic. Limits come from the config (front.* and worker.max_stop_*); the stop
fields are checked by StopRules (detok_worker/stream/stop/rules.py), the one place of the stop rule."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from detok_worker.bus.messages import DetokParams, RequestParams
from detok_worker.config import DetokConfig
from detok_worker.config.schema import PROMPT_TOKENS_CAP
from detok_worker.front.errors import APIError, bad_request
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest, GenerationRequest
from detok_worker.stream.stop.rules import StopLimits, StopRuleError, StopRules
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, validate_token_ids

_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)

# (field, lowest, highest) for the sampling fields we accept but leave to the token source.
_SAMPLING_RANGES = (
    ("temperature", 0.0, 2.0),
    ("top_p", 0.0, 1.0),
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
    ("repetition_penalty", 0.0, 100.0),
)
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Limits:
    model_name: str
    vocab_size: int
    max_tokens_default: int
    max_tokens_limit: int
    max_prompt_chars: int
    max_prompt_tokens: int
    stop: StopLimits
    eos_ids: frozenset[int]
    # The tokenizer's own id rule (raises InvalidTokenIdError): some ids inside the range name no token.
    check_ids: Callable[[Sequence[int]], None]

    @classmethod
    def from_config(cls, config: DetokConfig, model_name: str, tokenizer: Tokenizer) -> Limits:
        return cls(
            model_name=model_name,
            vocab_size=tokenizer.vocab_size,
            check_ids=lambda ids: validate_token_ids(tokenizer, ids),
            max_tokens_default=config.front.max_tokens_default,
            max_tokens_limit=config.front.max_tokens_limit,
            max_prompt_chars=config.front.max_prompt_chars,
            max_prompt_tokens=max_prompt_tokens(config, tokenizer),
            stop=StopLimits.from_config(config),
            eos_ids=frozenset(tokenizer.eos_token_ids),
        )


def max_prompt_tokens(config: DetokConfig, tokenizer: Tokenizer) -> int:
    """front.max_prompt_tokens, or (0) the tokenizer's model_max_length where its files say it, at most the cap."""
    if config.front.max_prompt_tokens:
        return config.front.max_prompt_tokens
    model_max = getattr(tokenizer, "model_max_length", None)
    return min(model_max, PROMPT_TOKENS_CAP) if isinstance(model_max, int) and model_max > 0 else PROMPT_TOKENS_CAP


def check_prompt_chars(chars: int, limits: Limits, param: str) -> None:
    """Before encoding: a prompt longer than front.max_prompt_chars is refused without tokenizing it."""
    if chars > limits.max_prompt_chars:
        message = f"the {param} has {chars} characters; at most {limits.max_prompt_chars} are allowed"
        raise bad_request(message, param, code="prompt_too_long")


def check_prompt_tokens(ids: Sequence[int], limits: Limits, param: str) -> None:
    if len(ids) > limits.max_prompt_tokens:
        message = f"the {param} has {len(ids)} tokens; at most {limits.max_prompt_tokens} are allowed"
        raise bad_request(message, param, code="prompt_too_long")


def decode_completion(body: bytes) -> CompletionRequest:
    return _decode(_completion_decoder, body)


def decode_chat(body: bytes) -> ChatCompletionRequest:
    return _decode(_chat_decoder, body)


def _decode(decoder: msgspec.json.Decoder, body: bytes):  # type: ignore[no-untyped-def]
    if not body.strip():
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise bad_request(f"invalid request: {exc}", code="invalid_type") from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON (UTF-8): {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise bad_request("the request body is nested too deeply", code="invalid_json") from exc


def check_model(requested: str | None, limits: Limits) -> str:
    if requested is not None and requested != limits.model_name:
        raise APIError(
            404,
            f"the model {requested!r} does not exist; this server serves {limits.model_name!r}",
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    return limits.model_name


def check_token_ids(ids: list[int], limits: Limits, param: str) -> None:
    try:
        limits.check_ids(ids)
    except InvalidTokenIdError as error:
        message = f"token id {error.token_id} in {param} is not a token of this model (ids: 0..{limits.vocab_size - 1})"
        raise bad_request(message, param) from error


def _max_tokens(request: GenerationRequest, limits: Limits, override: int | None) -> int:
    param = "max_completion_tokens" if override is not None else "max_tokens"
    value = override if override is not None else request.max_tokens
    if value is None:
        return limits.max_tokens_default
    if value < 1:
        raise bad_request(f"{param} must be at least 1 (got {value})", param)
    if value > limits.max_tokens_limit:
        raise bad_request(f"{param} must be at most {limits.max_tokens_limit} (got {value})", param)
    return value


def _check_sampling(request: GenerationRequest) -> None:
    for name, low, high in _SAMPLING_RANGES:
        value = getattr(request, name)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            raise bad_request(f"{name} must be between {low} and {high} (got {value})", name)
    if request.top_k is not None and not -1 <= request.top_k <= _INT64_MAX:
        raise bad_request("top_k must be -1 (off) or a positive number", "top_k")
    if request.seed is not None and not -(2**63) <= request.seed <= _INT64_MAX:
        raise bad_request("seed must fit in 64 bits", "seed")


def _check_unsupported(request: CompletionRequest | ChatCompletionRequest) -> None:
    unsupported: list[tuple[str, bool]] = [
        ("echo", request.echo),
        ("logprobs", request.logprobs not in (None, False, 0)),
    ]
    if isinstance(request, CompletionRequest):
        unsupported += [("suffix", request.suffix is not None), ("best_of", request.best_of not in (None, 1))]
    else:
        unsupported += [
            ("top_logprobs", request.top_logprobs not in (None, 0)),
            ("chat_template", request.chat_template is not None),
            ("response_format", request.response_format not in (None, {"type": "text"})),
        ]
    for name, used in unsupported:
        if used:
            raise bad_request(f"{name} is not supported by this server", name, code="unsupported_parameter")


@dataclass(frozen=True, slots=True)
class CheckedParams:
    params: RequestParams
    stop_rules: StopRules
    include_usage: bool


def check_generation(request: CompletionRequest | ChatCompletionRequest, limits: Limits) -> CheckedParams:
    """Validate everything but the prompt; build the engine's RequestParams."""
    if request.n != 1:
        raise bad_request(f"only n=1 is supported (got n={request.n})", "n")
    if request.stream_options is not None and not request.stream:
        raise bad_request("stream_options can only be set when stream is true", "stream_options")
    _check_unsupported(request)
    _check_sampling(request)
    override = request.max_completion_tokens if isinstance(request, ChatCompletionRequest) else None
    max_tokens = _max_tokens(request, limits, override)
    if not 0 <= request.min_tokens <= max_tokens:
        raise bad_request(f"min_tokens must be between 0 and max_tokens ({max_tokens})", "min_tokens")
    stop_token_ids = list(request.stop_token_ids or [])
    detok = DetokParams(
        stop=[request.stop] if isinstance(request.stop, str) else list(request.stop or []),
        stop_token_ids=stop_token_ids,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        min_tokens=request.min_tokens,
    )
    try:
        stop_rules = StopRules.from_params(detok, limits.stop, limits.eos_ids, ignore_eos=request.ignore_eos)
    except StopRuleError as exc:
        raise bad_request(str(exc), exc.param) from exc
    check_token_ids(stop_token_ids, limits, "stop_token_ids")
    params = RequestParams(max_tokens=max_tokens, detok=detok, ignore_eos=request.ignore_eos)
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return CheckedParams(params, stop_rules, include_usage)
