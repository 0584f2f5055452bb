"""Request checks shared by both endpoints: everything a client can get wrong becomes a 4xx APIError here,
before any prompt work or bus traffic. Limits come from the config (front.* and worker.max_stop_*); the stop
fields are checked by StopRules (detok_worker/stream/stop/rules.py), the one place of the stop rule."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec

from detok_worker.bus.messages import DetokParams, RequestParams
from detok_worker.bus.request_fields import (
    FIELD_BY_NAME,
    INT64_MAX,
    REQUEST_FIELDS,
    VLLM_SOURCE,
    is_set,
    other_than,
    truthy,
)
from detok_worker.config import DetokConfig
from detok_worker.config.schema import PROMPT_TOKENS_CAP
from detok_worker.errors import ParameterError
from detok_worker.front.errors import APIError, bad_request
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest, GenerationRequest
from detok_worker.front.sampling import checked_values, sampling_params
from detok_worker.stream.stop.rules import StopLimits, StopRules
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, added_token_contents, id_check

PRIORITY_HEADER = "x-vllm-priority"
SESSION_HEADER = "x-session-id"
R = TypeVar("R", CompletionRequest, ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)


@dataclass(frozen=True, slots=True)
class Limits:
    model_name: str  # front.model_name, or the tokenizer's name (served_model_name says which name is served)
    vocab_size: int
    max_tokens_default: int  # 0 = the engine's own default
    max_tokens_limit: int
    max_prompt_chars: int
    max_prompt_tokens: int
    max_n: int
    stop: StopLimits
    eos_ids: frozenset[int]
    # The tokenizer's own id rule (raises InvalidTokenIdError): some ids inside the range name no token.
    check_ids: Callable[[Sequence[int]], None]
    model_name_set: bool = False  # front.model_name is set: it is served whatever the engine's model is named
    model_aliases: tuple[str, ...] = ()  # front.model_aliases: more names requests may give
    # LoRA adapter name -> path, each served as a model of its own (a live view: adapters come and go at run time)
    lora_adapters: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    completions_max_tokens_default: int = 0  # 0 = max_tokens_default
    force_include_usage: bool = False  # front.force_include_usage
    exclude_tools_when_tool_choice_none: bool = False  # front.exclude_tools_when_tool_choice_none
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    engine_source: str = ""  # engine.source: named when a request sets a field the engine does not pass on
    prompt_tokens_details: bool = False  # front.prompt_tokens_details: the engine reports cached prompt tokens
    tool_parser_grammar: bool = False  # front.tool_choice_grammar = "tool_parser": the engine builds it
    # the tokenizer says which tokens are added ones (Hugging Face `tokenizers`): spaces_between_special_tokens false
    added_tokens_known: bool = True

    @property
    def vllm_server(self) -> bool:
        """Answers take the shape vLLM's own server gives them (`--source vllm`: a drop-in for `vllm serve`)."""
        return self.engine_source == VLLM_SOURCE

    @classmethod
    def from_config(
        cls, config: DetokConfig, model_name: str, tokenizer: Tokenizer, lora_adapters: dict[str, str] | None = None
    ) -> Limits:
        """`lora_adapters`: the table of the adapters served, kept up to date by its owner (Dispatcher); else
        front.lora_adapters."""
        return cls(
            model_name=model_name,
            vocab_size=tokenizer.vocab_size,
            check_ids=id_check(tokenizer),
            max_tokens_default=config.front.max_tokens_default,
            max_tokens_limit=config.front.max_tokens_limit,
            max_prompt_chars=config.front.max_prompt_chars,
            max_prompt_tokens=max_prompt_tokens(config, tokenizer),
            max_n=config.front.max_n,
            stop=StopLimits.from_config(config),
            eos_ids=frozenset(tokenizer.eos_token_ids),
            model_name_set=bool(config.front.model_name),
            model_aliases=tuple(config.front.model_aliases),
            lora_adapters=MappingProxyType(
                dict(config.front.lora_adapters) if lora_adapters is None else lora_adapters
            ),
            completions_max_tokens_default=config.front.completions_max_tokens_default,
            force_include_usage=config.front.force_include_usage,
            exclude_tools_when_tool_choice_none=config.front.exclude_tools_when_tool_choice_none,
            chat_template_kwargs=MappingProxyType(dict(config.front.chat_template_kwargs)),
            engine_source=config.engine.source,
            prompt_tokens_details=config.front.prompt_tokens_details,
            tool_parser_grammar=config.front.tool_choice_grammar == "tool_parser",
            added_tokens_known=added_token_contents(tokenizer) is not None,
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
    return decode_json(_completion_decoder, body)


def decode_chat(body: bytes) -> ChatCompletionRequest:
    return decode_json(_chat_decoder, body)


def decode_json(decoder: msgspec.json.Decoder, body: bytes):  # type: ignore[no-untyped-def]
    """A request body through `decoder`; every failure is a 400 (naming the field where there is one)."""
    if not body.strip():
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        param, code = _invalid_field(str(exc))
        raise bad_request(f"invalid request: {exc}", param, code=code) from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON (UTF-8): {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise bad_request("the request body is nested too deeply", code="invalid_json") from exc


# a msgspec message naming a field -> the code of its error; the path of its parent where nested
_NAMED_FIELD = (
    (re.compile(r"unknown field `([^`]*)`(?: - at `\$\.([^`\[]*))?"), "unknown_parameter"),
    (re.compile(r"missing required field `([^`]*)`(?: - at `\$\.([^`\[]*))?"), "missing_required_parameter"),
)
_FIELD_PATH = re.compile(r" - at `\$\.([A-Za-z_][A-Za-z0-9_]*)")


def _invalid_field(message: str) -> tuple[str | None, str]:
    """The request field a msgspec validation message is about (unknown and missing fields: their dotted name)."""
    for pattern, code in _NAMED_FIELD:
        named = pattern.search(message)
        if named is not None:
            name, parent = named.groups()
            return (f"{parent}.{name}" if parent else name), code
    path = _FIELD_PATH.search(message)
    return (path.group(1) if path else None), "invalid_type"


def served_model_name(limits: Limits, engine_model_name: str) -> str:
    """The model name served: front.model_name when set, else the engine's (its served_model_name, once it reported
    one: what clients of that engine know it by), else the tokenizer's."""
    return engine_model_name if engine_model_name and not limits.model_name_set else limits.model_name


def check_model(requested: str | None, limits: Limits, engine_model_name: str = "") -> str:
    """The model name a response carries: the served one (served_model_name), or the LoRA adapter the request
    names. A request naming another model (none of the served name, its aliases, the adapters) is a 404."""
    served = served_model_name(limits, engine_model_name)
    if requested is not None and requested in limits.lora_adapters:
        return requested
    if requested is not None and requested != served and requested not in limits.model_aliases:
        raise APIError(
            404,
            f"the model {requested!r} does not exist; this server serves {served!r}",
            type="not_found_error",
            param="model",
            code="model_not_found",
        )
    return served


def with_vllm_headers(body: R, headers: Mapping[str, str], engine_refuses: Collection[str] = ()) -> R:
    """vLLM's headers: an integer in X-Vllm-Priority is the request's priority, in place of the body's (then
    checked as the body's would be; anything else in it is passed over, as vLLM does); X-Session-ID is the
    session_id of a request that gives none, for an engine that takes it (a hint, not a field: an engine that
    refuses session_id (`engine_refuses`, EngineStats.refused_fields) passes it over)."""
    header = headers.get(PRIORITY_HEADER)
    if header is not None:
        with contextlib.suppress(ValueError):
            body = msgspec.structs.replace(body, priority=int(header))
    session = headers.get(SESSION_HEADER)
    if session and body.session_id is None and "session_id" not in engine_refuses:
        body = msgspec.structs.replace(body, session_id=session)
    return body


def check_token_ids(ids: list[int], limits: Limits, param: str) -> None:
    try:
        limits.check_ids(ids)
    except InvalidTokenIdError as error:
        message = f"token id {error.token_id} in {param} is not a token of this model (ids: 0..{limits.vocab_size - 1})"
        raise bad_request(message, param) from error


def _max_tokens(request: GenerationRequest, limits: Limits, override: int | None, echo: bool) -> tuple[int, bool]:
    """(max_tokens, whether the engine applies its own default instead). max_tokens 0 is allowed with echo (vLLM:
    the response is the prompt alone)."""
    param = "max_completion_tokens" if override is not None else "max_tokens"
    value = override if override is not None else request.max_tokens
    if value is None:
        default = limits.max_tokens_default
        if isinstance(request, CompletionRequest) and limits.completions_max_tokens_default:
            default = limits.completions_max_tokens_default
        return (default, False) if default else (limits.max_tokens_limit, True)
    least = 0 if echo else 1
    if value < least:
        raise bad_request(f"{param} must be at least {least} (got {value})", param)
    if value > limits.max_tokens_limit:
        raise bad_request(f"{param} must be at most {limits.max_tokens_limit} (got {value})", param)
    return value, False


# field -> "this value asks for something detok cannot honour": a 400 naming the field (never silently dropped).
_REFUSED: dict[str, Callable[[Any], bool]] = {
    "best_of": other_than(None, 1),
    "use_beam_search": truthy,
    "length_penalty": other_than(None, 1, 1.0),
    **dict.fromkeys(
        ("guided_decoding_backend", "guided_whitespace_pattern", "logits_processors", "kv_transfer_params"), is_set
    ),
}
_REFUSED_COMPLETION: dict[str, Callable[[Any], bool]] = dict.fromkeys(("suffix", "prompt_embeds"), is_set)
_REFUSED_CHAT: dict[str, Callable[[Any], bool]] = {
    "chat_template": is_set,
    "audio": is_set,
    "functions": is_set,
    "function_call": is_set,
    "prediction": is_set,
    "moderation": is_set,
    "prompt_cache_options": is_set,
    "prompt_cache_retention": is_set,
    "verbosity": is_set,
    "web_search_options": is_set,
    "mm_processor_kwargs": is_set,
    "store": truthy,
    "service_tier": other_than(None, "auto", "default"),
    "modalities": other_than(None, ["text"]),
}


# every field the server refuses, per request type: all of them null (their default) asks nothing refused
_CHECKED_FIELDS = {
    request_type: attrgetter(*_REFUSED, *own)
    for request_type, own in ((CompletionRequest, _REFUSED_COMPLETION), (ChatCompletionRequest, _REFUSED_CHAT))
}


def _check_unsupported(
    request: CompletionRequest | ChatCompletionRequest, engine_source: str, engine_refuses: Collection[str]
) -> None:
    fields = _CHECKED_FIELDS.get(type(request))
    if fields is None or any(value is not None for value in fields(request)):  # the usual request: all null
        own = _REFUSED_COMPLETION if isinstance(request, CompletionRequest) else _REFUSED_CHAT
        for name, refused in (*_REFUSED.items(), *own.items()):
            if refused(getattr(request, name)):
                raise bad_request(f"{name} is not supported by this server", name, code="unsupported_parameter")
    for refused_name in engine_refuses:
        engine_field = FIELD_BY_NAME.get(refused_name)
        if engine_field is None:
            continue  # a field this front does not know: no request of its sets it
        name = engine_field.client_name
        if engine_field.asks(getattr(request, name, None)):
            message = (
                f"{name} is not passed on by this server's engine (engine source {engine_source!r}); the "
                f"{VLLM_SOURCE!r} engine source honours it (detok serve --source {VLLM_SOURCE})"
            )
            raise bad_request(message, name, code="unsupported_parameter")


VLLM_SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily


def _check_n(request: GenerationRequest, limits: Limits) -> int:
    n = 1 if request.n is None else request.n
    if not 1 <= n <= limits.max_n:
        raise bad_request(f"n must be between 1 and {limits.max_n} (got {n})", "n")
    temperature = request.temperature
    if n > 1 and limits.vllm_server and temperature is not None and temperature < VLLM_SAMPLING_EPS:
        # vLLM's SamplingParams refuses several samples of a greedy request (they would all be the same); here each
        # choice is an engine request of its own, so the engine never sees n
        raise bad_request(f"n must be 1 when using greedy sampling, got {n}.", "n")
    seed = request.seed
    if seed is not None and n > 1 and seed + n - 1 > INT64_MAX:  # choice i samples with seed + i
        raise bad_request("seed + n - 1 must fit in 64 bits (choice i samples with seed + i)", "seed")
    return n


def _spaces_between_special_tokens(request: GenerationRequest, limits: Limits) -> bool:
    """vLLM's option; false changes the text only with special tokens kept (stream/decode/added_tokens.py), and
    needs a tokenizer that says which tokens are added ones."""
    spaces = request.spaces_between_special_tokens is not False
    if not spaces and request.skip_special_tokens is False and not limits.added_tokens_known:
        message = (
            "spaces_between_special_tokens false with skip_special_tokens false is honoured for Hugging Face "
            "tokenizers (tokenizer.json) only"
        )
        raise bad_request(message, "spaces_between_special_tokens", code="unsupported_parameter")
    return spaces


def _stream_usage(request: GenerationRequest, forced: bool) -> tuple[bool, bool]:
    """Whether a stream ends with the usage, and whether each chunk carries its choice's running usage: vLLM's rule
    (should_include_usage). `forced` (front.force_include_usage, --enable-force-include-usage) turns both on;
    otherwise include_usage asks for the usage, and continuous_usage_stats for the running one with it (alone, a
    no-op, as on vLLM's server)."""
    if forced:
        return True, True
    options = request.stream_options
    include_usage = bool(options and options.include_usage)
    return include_usage, include_usage and bool(options and options.continuous_usage_stats)


@dataclass(frozen=True, slots=True)
class CheckedParams:
    params: RequestParams
    stop_rules: StopRules
    include_usage: bool
    continuous_usage: bool
    n: int
    echo: bool


def check_generation(
    request: CompletionRequest | ChatCompletionRequest,
    limits: Limits,
    model_vocab_size: int = 0,
    engine_refuses: Collection[str] = (),
) -> CheckedParams:
    """Validate everything but the prompt; build the engine's RequestParams. `model_vocab_size`: the model's
    vocabulary size where the engine reported one larger than the tokenizer's (its ids may be sampled);
    `engine_refuses`: the request fields the engine does not pass on (EngineStats.refused_fields)."""
    n = _check_n(request, limits)
    if request.stream_options is not None and not request.stream:
        raise bad_request("stream_options can only be set when stream is true", "stream_options")
    _check_unsupported(request, limits.engine_source, engine_refuses)
    truncate = request.truncate_prompt_tokens
    if truncate is not None and truncate < 1 and truncate != -1:
        raise bad_request("truncate_prompt_tokens must be -1 or at least 1", "truncate_prompt_tokens")
    vocab_size = max(limits.vocab_size, model_vocab_size)
    scores_prompts = "prompt_logprobs" not in engine_refuses
    sampling = sampling_params(request, vocab_size, scores_prompts, limits.tool_parser_grammar)
    override = request.max_completion_tokens if isinstance(request, ChatCompletionRequest) else None
    echo = isinstance(request, CompletionRequest) and bool(request.echo)
    max_tokens, engine_max_tokens = _max_tokens(request, limits, override, echo)
    min_tokens = request.min_tokens or 0
    stop_token_ids = list(request.stop_token_ids or [])
    detok = DetokParams(
        stop=[request.stop] if isinstance(request.stop, str) else list(request.stop or []),
        stop_token_ids=stop_token_ids,
        include_stop_str_in_output=bool(request.include_stop_str_in_output),
        skip_special_tokens=request.skip_special_tokens is not False,
        min_tokens=min_tokens,
        return_token_ids=bool(request.return_token_ids),
        spaces_between_special_tokens=_spaces_between_special_tokens(request, limits),
    )
    ignore_eos = bool(request.ignore_eos)
    try:
        stop_rules = StopRules.from_params(detok, limits.stop, limits.eos_ids, ignore_eos=ignore_eos)
    except ParameterError as exc:
        raise bad_request(str(exc), exc.param) from exc
    if min_tokens > max_tokens:  # min_tokens >= 0 is the stop rules' check
        raise bad_request(f"min_tokens must be between 0 and max_tokens ({max_tokens})", "min_tokens")
    check_token_ids(stop_token_ids, limits, "stop_token_ids")
    params = RequestParams(
        max_tokens=max_tokens,
        detok=detok,
        ignore_eos=ignore_eos,
        sampling=sampling,
        engine_max_tokens=engine_max_tokens,
        **checked_values(request, REQUEST_FIELDS),
        report_cached=limits.prompt_tokens_details,
    )
    include_usage, continuous_usage = _stream_usage(request, limits.force_include_usage)
    return CheckedParams(params, stop_rules, include_usage, continuous_usage, n, echo)


def truncate_prompt(
    ids: list[int], request: CompletionRequest | ChatCompletionRequest, max_model_len: int | None
) -> list[int]:
    """vLLM's truncate_prompt_tokens: keep k prompt ids, the last ones (truncation_side "left", vLLM's default for
    generation) or the first ("right"); -1: as many as the context holds (`max_model_len`), less one when the
    request asks for output tokens (vLLM's max_truncation_tokens)."""
    keep = request.truncate_prompt_tokens
    if keep is None:
        return ids
    if keep == -1:
        if not max_model_len:
            message = "truncate_prompt_tokens -1 needs the context length, which this server does not know"
            raise bad_request(message, "truncate_prompt_tokens")
        asks_output = isinstance(request, CompletionRequest) or request.max_tokens or request.max_completion_tokens
        keep = max_model_len - 1 if asks_output else max_model_len
    elif max_model_len and keep > max_model_len:
        message = f"truncate_prompt_tokens={keep} cannot be greater than max_model_len={max_model_len}"
        raise bad_request(message, "truncate_prompt_tokens")
    if len(ids) <= keep:
        return ids
    return ids[:keep] if request.truncation_side == "right" else ids[-keep:]
