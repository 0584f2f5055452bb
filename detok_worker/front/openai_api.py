"""OpenAI-compatible request and response bodies as msgspec Structs.

Requests: unknown fields are ignored (clients send many sampling fields an engine stub has no use for); fields
we cannot honour are checked in validation.py. vLLM extensions are accepted under vLLM's names (stop_token_ids,
skip_special_tokens, include_stop_str_in_output, min_tokens, ignore_eos, add_special_tokens,
chat_template_kwargs, add_generation_prompt, continue_final_message, documents).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

# ---- requests ---------------------------------------------------------------------------------------------


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class GenerationRequest(msgspec.Struct, kw_only=True):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    ignore_eos: bool = False
    n: int = 1
    add_special_tokens: bool | None = None  # None = the endpoint's default (vLLM's)
    # Sampling fields: accepted and range-checked; the token source decides the output.
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    user: str | None = None


class CompletionRequest(GenerationRequest, kw_only=True):
    # A string, a list of token ids, or a one-element list of either (OpenAI's batch forms; n=1 only).
    prompt: str | list[str | int | list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None


class ChatCompletionRequest(GenerationRequest, kw_only=True):
    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    documents: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    reasoning_effort: str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    echo: bool = False
    response_format: dict[str, Any] | None = None


# ---- responses --------------------------------------------------------------------------------------------


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: None = None


class CompletionResponse(msgspec.Struct):
    """A /v1/completions body, and (object="text_completion", usage UNSET or None) each streamed chunk."""

    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None | UnsetType = UNSET
    object: str = "text_completion"


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
    reasoning_content: str | None | UnsetType = UNSET  # set when the request has a reasoning parser
    tool_calls: list[ToolCallOut] | UnsetType = UNSET  # set when the request has a tool-call parser


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: None = None


class ChatCompletionResponse(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"


class ChatDelta(msgspec.Struct):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChatDelta
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None | UnsetType = UNSET
    object: str = "chat.completion.chunk"


class ModelCard(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "detok"
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
