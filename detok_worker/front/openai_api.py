"""OpenAI-compatible request and response bodies as msgspec Structs.

Requests: every field of OpenAI's chat and completions schemas and of vLLM's extensions is declared here, and an
unknown field is a 400 naming it: a parameter is either used (forwarded to the engine, or applied by the front)
or refused, never accepted and dropped (validation.py and sampling.py decide which). Where vLLM accepts `null` a
field does too (null = the default). Fields detok always refuses when set are typed `Any`, so that any value
gets the 400 that names the field rather than a type error.
"""

from __future__ import annotations

import secrets
import time
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

# ---- requests ---------------------------------------------------------------------------------------------


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class GenerationRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    user: str | None = None  # informational (OpenAI: abuse monitoring); no effect on the output
    # sampling and constraints: forwarded to the engine (bus SamplingParams)
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    # vLLM's sampling extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: str | None = None
    structured_outputs: dict[str, Any] | None = None
    # vLLM's detokenizer extensions (bus DetokParams) and prompt options
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None  # null = true
    include_stop_str_in_output: bool | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    add_special_tokens: bool | None = None  # None = the endpoint's default (vLLM's)
    spaces_between_special_tokens: bool | None = None  # null = true
    truncate_prompt_tokens: int | None = None  # keep k prompt ids (-1: as many as the context holds)
    truncation_side: Literal["left", "right"] | None = None  # which end truncate_prompt_tokens cuts (null: left)
    request_id: str | None = None  # like the X-Request-Id header
    # completions: top candidates per token (int); chat: bool (with top_logprobs). Checked in sampling.py.
    logprobs: Any = None
    echo: bool | None = None  # completions: the prompt before each choice's text; chat: the last message's content
    return_token_ids: bool | None = None  # the prompt's and each choice's token ids in the response
    # vLLM's engine fields: honoured with engine.source = "vllm" only (validation.py refuses them elsewhere)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    priority: int | None = None
    cache_salt: str | None = None
    prompt_logprobs: int | None = None  # top candidates per prompt token (-1: all); not with stream (as vLLM)
    session_id: str | None = None  # a conversation's stable id (vLLM's; also its X-Session-ID header)
    thinking_token_budget: int | None = None  # vLLM's: the most reasoning tokens (-1: no limit)
    # vLLM's: extra arguments for the engine's custom logits processors (its SamplingParams.extra_args)
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    stream_interval: int | None = None  # vLLM's: a stream's pieces every this many tokens (at least the server's)
    # refused when set (validation.py): detok cannot honour them (yet)
    best_of: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    logits_processors: Any = None
    return_tokens_as_token_ids: bool | None = None  # null: front.return_tokens_as_token_ids
    kv_transfer_params: Any = None


class CompletionRequest(GenerationRequest, kw_only=True, forbid_unknown_fields=True):
    # A string, a list of token ids, or a one-element list of either (OpenAI's batch forms).
    prompt: str | list[str | int | list[int]]
    suffix: Any = None
    prompt_embeds: Any = None
    # vLLM's engine field (completions only): these ids' logprobs at each output position, in place of the top ones
    logprob_token_ids: list[int] | None = None


class ChatCompletionRequest(GenerationRequest, kw_only=True, forbid_unknown_fields=True):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None  # null = true
    include_reasoning: bool | None = None  # vLLM's: false leaves the parsed reasoning out of the answer
    return_prompt_text: bool | None = None  # vLLM's: the answer carries the rendered prompt (prompt_text)
    continue_final_message: bool | None = None
    reasoning_effort: str | None = None
    top_logprobs: int | None = None
    # informational: no effect on the output by OpenAI's definition (stored-completion tags, abuse monitoring,
    # a cache-routing hint)
    metadata: dict[str, str] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # accepted only at their no-op values (validation.py)
    store: bool | None = None
    service_tier: str | None = None
    modalities: list[str] | None = None
    # refused when set
    chat_template: Any = None
    audio: Any = None
    functions: Any = None
    function_call: Any = None
    prediction: Any = None
    moderation: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    mm_processor_kwargs: Any = None


# ---- responses --------------------------------------------------------------------------------------------


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int  # of the prompt, held by the engine's prefix cache
    created_cache_tokens: int | UnsetType = UNSET  # computed by its prefill and written to the prefix cache


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET  # front.prompt_tokens_details (vLLM's)
    completion_tokens_details: CompletionTokensDetails | UnsetType = UNSET  # front.reasoning_tokens_details (chat)


class CompletionLogprobs(msgspec.Struct):
    """The legacy completions shape: parallel lists, one entry per output token. text_offset: character offset of
    each token in the text, counted as vLLM does (the lengths of the `tokens` strings before it)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprobOut(msgspec.Struct):
    """One id's entry at a prompt position (vLLM's Logprob): its log-probability, its rank in the vocabulary (1 =
    the most likely) and its text."""

    logprob: float
    rank: int | None
    decoded_token: str | None


# vLLM's prompt_logprobs: per prompt token, None for the first, then token id -> its entry
PromptLogprobsOut = list[dict[int, PromptLogprobOut] | None]


class CompletionChoice(msgspec.Struct):
    """token_ids / prompt_token_ids (vLLM's, with return_token_ids): the choice's output ids (streamed: those of
    this chunk) and the prompt's (streamed: on the choice's first chunk). prompt_logprobs: vLLM's, when asked."""

    index: int
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int] | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET
    prompt_logprobs: PromptLogprobsOut | UnsetType = UNSET


class TopLogprobOut(msgspec.Struct):
    token: str
    logprob: float | None
    bytes: list[int]


class TokenLogprobOut(TopLogprobOut):
    top_logprobs: list[TopLogprobOut]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprobOut]


class CompletionResponse(msgspec.Struct):
    """A /v1/completions body, and (object="text_completion", usage UNSET or None) each streamed chunk."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None | UnsetType = UNSET
    object: str = "text_completion"
    system_fingerprint: str | UnsetType = UNSET  # the engine's (vLLM's), where vLLM's server writes it


class FunctionCallOut(msgspec.Struct):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallOut(msgspec.Struct):
    """A tool call: whole in a message; in a stream, the first piece has index, id, type and the name, later
    pieces only index and an arguments fragment (as OpenAI and vLLM stream them)."""

    function: FunctionCallOut
    index: int | UnsetType = UNSET
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET


class ChatMessageOut(msgspec.Struct):
    content: str | None
    role: str = "assistant"
    # the reasoning, with a reasoning parser: in the field front.reasoning_field names (vLLM 0.32's is `reasoning`)
    reasoning_content: str | None | UnsetType = UNSET
    reasoning: str | None | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET  # set when the request has a tool-call parser


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | UnsetType = UNSET  # with return_token_ids (vLLM's)


class ChatCompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET  # with return_token_ids (vLLM's)
    prompt_text: str | UnsetType = UNSET  # with return_prompt_text (vLLM's): the rendered prompt
    prompt_logprobs: PromptLogprobsOut | UnsetType = UNSET  # with prompt_logprobs (vLLM's)


class ChatDelta(msgspec.Struct):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int] | UnsetType = UNSET  # with return_token_ids: this chunk's output ids


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None | UnsetType = UNSET
    object: str = "chat.completion.chunk"
    system_fingerprint: str | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET  # with return_token_ids: on each choice's first chunk
    prompt_text: str | UnsetType = UNSET  # with return_prompt_text: on each choice's first chunk


class ModelPermission(msgspec.Struct):
    """vLLM's ModelPermission (the one entry of its cards' `permission`), with vLLM's values."""

    id: str = msgspec.field(default_factory=lambda: f"modelperm-{secrets.token_hex(8)}")
    object: str = "model_permission"
    created: int = msgspec.field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(msgspec.Struct, kw_only=True):
    """A model's card, its fields in vLLM's order; `permission` only where it is vLLM's card (`--source vllm`)."""

    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "detok"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None  # vLLM's: the context length, when known
    permission: list[ModelPermission] | UnsetType = UNSET


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
