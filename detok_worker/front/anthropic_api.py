"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as another shape of a chat request.

A Messages body is checked here (an unknown field or block is a 400 naming it), turned into the chat request it
means (`to_chat`: the system prompt, text, tool_use and tool_result blocks, tools and tool_choice, thinking,
stop_sequences, as vLLM's server turns them), and runs the chat path of generation.py: the same prompt rendering,
stop rules, parsers and exactly-once delivery. `MessagesFormatter` shapes its answer: a `message` body, or
Anthropic's event stream (message_start, content blocks with text/thinking/input_json deltas, message_delta with
the stop reason and usage, message_stop). Errors take Anthropic's shape (`anthropic_error_response`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import msgspec
from starlette.responses import Response

from detok_worker.front.choices import Choices
from detok_worker.front.errors import JSON, APIError, bad_request, renamed_param, reshaped_error
from detok_worker.front.openai_api import ChatCompletionRequest, StreamOptions
from detok_worker.front.prompts import function_tool, tool_call
from detok_worker.front.request_stream import RequestStream
from detok_worker.front.responses import REASONING, TEXT, TOOL_CALL, Block, BlockFormatter
from detok_worker.front.sse import named_event, named_events_framing
from detok_worker.front.validation import decode_json

# Claude Code starts its system prompt with a per-request attribution line; vLLM's server drops it so that the
# prompt's prefix stays cacheable, and so does detok
BILLING_HEADER = "x-anthropic-billing-header"

# ---- requests ---------------------------------------------------------------------------------------------


class ContentBlock(msgspec.Struct, forbid_unknown_fields=True):
    """One block of a message's content; which fields count depends on `type`."""

    type: Literal["text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # thinking
    signature: str | None = None
    data: str | None = None  # redacted_thinking
    source: Any = None  # image, document: refused
    cache_control: dict[str, Any] | None = None  # a prompt caching hint: the engine's prefix cache needs none
    citations: Any = None


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None
    type: Literal["custom"] | None = None  # a built-in tool (web search, bash, ...) has another type: refused
    cache_control: dict[str, Any] | None = None


class ToolChoice(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None
    display: str | None = None  # how Anthropic shows its own thinking: the reasoning is always returned here


class Metadata(msgspec.Struct, forbid_unknown_fields=True):
    user_id: str | None = None


class OutputFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, forbid_unknown_fields=True):
    format: OutputFormat | None = None
    effort: str | None = None


class CountTokensRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The prompt side of a Messages request: all /v1/messages/count_tokens takes."""

    model: str
    messages: list[Message]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's


class MessagesRequest(CountTokensRequest, kw_only=True, forbid_unknown_fields=True):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    cache_control: dict[str, Any] | None = None  # a prompt caching hint: the engine's prefix cache needs none
    # vLLM's extensions of its Messages API
    cache_salt: str | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    kv_transfer_params: Any = None  # refused (as on chat)


class CountTokensResponse(msgspec.Struct):
    input_tokens: int


class MessageUsage(msgspec.Struct, omit_defaults=True):
    """input_tokens: the prompt's not read from or written to the prefix cache (those two counts are there when
    the engine tells them: front.prompt_tokens_details)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessageBody(msgspec.Struct):
    """A whole answer, and (content empty, no stop reason) the message of a stream's message_start. Content blocks:
    thinking, text, tool_use (in that order in a whole answer)."""

    id: str
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: MessageUsage
    type: str = "message"
    role: str = "assistant"


_messages_decoder = msgspec.json.Decoder(MessagesRequest)
_count_decoder = msgspec.json.Decoder(CountTokensRequest)

# a chat request's field -> the Messages field a client set (what a refusal names)
_FIELD_NAMES = {
    "stop": "stop_sequences",
    "thinking_token_budget": "thinking.budget_tokens",
    "user": "metadata.user_id",
    "response_format": "output_config.format",
    "reasoning_effort": "output_config.effort",
}


def decode_messages(body: bytes) -> ChatCompletionRequest:
    """A /v1/messages body as the chat request it means."""
    request: MessagesRequest = decode_json(_messages_decoder, body)
    if request.max_tokens < 1:
        raise bad_request("max_tokens must be at least 1", "max_tokens")
    thinking = request.thinking
    if thinking is not None and thinking.type == "enabled":
        if thinking.budget_tokens is None:
            raise bad_request("thinking.budget_tokens is required when thinking is enabled", "thinking.budget_tokens")
        if not 1024 <= thinking.budget_tokens < request.max_tokens:
            raise bad_request("thinking.budget_tokens must be at least 1024 and less than max_tokens", "thinking")
    chat = to_chat(request)
    chat.max_tokens = request.max_tokens
    chat.stop = request.stop_sequences
    chat.temperature, chat.top_p, chat.top_k = request.temperature, request.top_p, request.top_k
    chat.cache_salt, chat.vllm_xargs = request.cache_salt, request.vllm_xargs
    chat.kv_transfer_params = request.kv_transfer_params
    chat.user = request.metadata.user_id if request.metadata is not None else None
    if request.stream:
        chat.stream = True
        chat.stream_options = StreamOptions(include_usage=True)  # the usage goes on message_delta
    return chat


def decode_count_tokens(body: bytes) -> ChatCompletionRequest:
    return to_chat(decode_json(_count_decoder, body))


def to_chat(request: CountTokensRequest) -> ChatCompletionRequest:
    """The prompt side of a Messages request as a chat request: messages, tools, tool_choice, thinking, output."""
    messages: list[dict[str, Any]] = []
    system = _system_text(request.system)
    if system:
        messages.append({"role": "system", "content": system})
    for position, message in enumerate(request.messages):
        _add_message(message, messages, f"messages[{position}]")
    kwargs = dict(request.chat_template_kwargs or {})
    chat = ChatCompletionRequest(model=request.model, messages=messages, chat_template_kwargs=kwargs or None)
    if request.tools:
        chat.tools = [_tool(tool, index) for index, tool in enumerate(request.tools)]
        chat.tool_choice = "auto"
    choice = request.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise bad_request("tool_choice.name is required when its type is 'tool'", "tool_choice")
            chat.tool_choice = {"type": "function", "function": {"name": choice.name}}
        else:
            chat.tool_choice = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use is not None:
            chat.parallel_tool_calls = not choice.disable_parallel_tool_use
    thinking = request.thinking
    if thinking is not None:
        # the switch the chat templates of thinking models read (Qwen3, DeepSeek-V3.1, GLM-4.5, ...)
        kwargs.setdefault("enable_thinking", thinking.type != "disabled")
        chat.chat_template_kwargs = kwargs
        if thinking.type == "enabled" and isinstance(request, MessagesRequest):
            chat.thinking_token_budget = thinking.budget_tokens
    output = request.output_config
    if output is not None:
        if output.format is not None:
            chat.response_format = {
                "type": "json_schema",
                "json_schema": {"name": "json_schema", "schema": output.format.schema},
            }
        chat.reasoning_effort = output.effort
    return chat


def _system_text(system: str | list[ContentBlock] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    parts = []
    for index, block in enumerate(system):
        if block.type != "text":
            raise bad_request(f"a system block must be text, not {block.type}", f"system[{index}].type")
        if block.text and not block.text.startswith(BILLING_HEADER):
            parts.append(block.text)
    return "".join(parts)


def _add_message(message: Message, messages: list[dict[str, Any]], where: str) -> None:
    """Append the chat messages one Messages message makes: a user's tool results become tool messages (before
    what else it says), an assistant's tool_use blocks its tool calls and its thinking its reasoning."""
    if message.role == "system":
        text = _system_text(message.content)
        if text:
            messages.append({"role": "system", "content": text})
        return
    out: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, str):
        out["content"] = message.content
        messages.append(out)
        return
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for index, block in enumerate(message.content):
        at = f"{where}.content[{index}]"
        if block.type == "text":
            if block.text:
                texts.append(block.text)
        elif block.type == "thinking":
            reasoning.append(block.thinking or "")
        elif block.type == "redacted_thinking":
            continue  # opaque: a client sends back what it was given
        elif block.type == "tool_use":
            if message.role != "assistant":
                raise bad_request("tool_use blocks belong to assistant messages", f"{at}.type")
            calls.append(tool_call(block.id or "", block.name or "", json.dumps(block.input or {}, ensure_ascii=False)))
        elif block.type == "tool_result":
            if message.role != "user":
                raise bad_request("tool_result blocks belong to user messages", f"{at}.type")
            result = _result_text(block, at)
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id or "", "content": result})
        else:
            raise bad_request(f"{block.type} blocks are not supported: this server takes text only", f"{at}.type")
    if reasoning:
        out["reasoning"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    if len(texts) == 1:
        out["content"] = texts[0]
    elif texts:
        out["content"] = [{"type": "text", "text": text} for text in texts]
    elif not calls and not reasoning:
        return  # only tool results: they are the turn
    messages.append(out)


def _result_text(block: ContentBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    texts = []
    for index, item in enumerate(block.content):
        if item.get("type") != "text":
            raise bad_request("a tool_result's content blocks must be text", f"{where}.content[{index}].type")
        texts.append(str(item.get("text", "")))
    return "\n".join(texts)


def _tool(tool: Tool, index: int) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise bad_request(f"built-in tools are not supported: {tool.type}", f"tools[{index}].type")
    return function_tool(tool.name, tool.description, {"type": "object", **tool.input_schema}, tool.strict)


# ---- errors -----------------------------------------------------------------------------------------------

# Anthropic's error types by HTTP status (its SDKs pick their exception class by status)
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class AnthropicError(msgspec.Struct):
    type: str
    message: str


class AnthropicErrorBody(msgspec.Struct):
    error: AnthropicError
    type: str = "error"


def anthropic_error(error: APIError) -> bytes:
    message = renamed_param(error, _FIELD_NAMES).message
    return msgspec.json.encode(AnthropicErrorBody(AnthropicError(_ERROR_TYPES.get(error.status, "api_error"), message)))


def anthropic_error_response(response: Any) -> Any:
    """An error response of the chat path in Anthropic's shape (same status and headers); any other response (an
    answer, an event stream) as it is."""

    def in_anthropics_shape(error: APIError, headers: dict[str, str]) -> Response:
        return Response(anthropic_error(error), status_code=error.status, media_type=JSON, headers=headers)

    return reshaped_error(response, in_anthropics_shape)


# ---- responses --------------------------------------------------------------------------------------------


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return named_event(kind, msgspec.json.encode({"type": kind, **payload}))


def _error_event(error: APIError) -> bytes:
    return named_event("error", anthropic_error(error))


ANTHROPIC_FRAMING = named_events_framing(_error_event)


def stop_reason(finish: str | None, matched: str | int | None, calls: list[str]) -> tuple[str | None, str | None]:
    """Anthropic's stop_reason and stop_sequence for a chat choice's end, as vLLM's server maps them: max_tokens
    for a length end; tool_use when the model called tools whose arguments are whole JSON (a stop string that cut
    the last call short is the stop_sequence instead); end_turn for the model's own end."""
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if calls and all(_is_json(arguments) for arguments in calls):
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return ("tool_use" if calls else "end_turn"), None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class MessagesFormatter(BlockFormatter):
    """A Messages answer from a chat request's output (one choice: the API has no n): blocks thinking, text and
    tool_use, streamed as content_block_start, deltas and content_block_stop."""

    framing = ANTHROPIC_FRAMING
    call_id_prefix = "toolu_"

    @staticmethod
    def _message_usage(stream: RequestStream) -> MessageUsage:
        cached = stream.cached_tokens
        if cached is None:
            return MessageUsage(stream.prompt_tokens, stream.n_tokens)
        read, created = cached
        return MessageUsage(max(0, stream.prompt_tokens - read - created), stream.n_tokens, created, read)

    def first_chunks(self, index: int, stream: RequestStream) -> list[bytes]:
        message = MessageBody(self.rid, self.model, [], None, None, MessageUsage(stream.prompt_tokens, 0))
        return [_event("message_start", {"message": message})]

    @staticmethod
    def _block(kind: str, text: str, name: str = "", call_id: str = "") -> dict[str, Any]:
        """A content block with its text (none yet on content_block_start; all of it in a whole answer)."""
        if kind == REASONING:  # Anthropic signs its thinking; a client sends the signature back, detok ignores it
            return {"type": "thinking", "thinking": text, "signature": uuid.uuid4().hex if text else ""}
        if kind == TEXT:
            return {"type": "text", "text": text}
        given = json.loads(text) if _is_json(text) else None
        return {"type": "tool_use", "id": call_id, "name": name, "input": given if isinstance(given, dict) else {}}

    def _opened(self, kind: str, name: str, call_id: str) -> list[bytes]:
        block = self._block(kind, "", name, call_id)
        return [_event("content_block_start", {"index": self.blocks - 1, "content_block": block})]

    def _delta_event(self, kind: str, text: str, number: str) -> bytes:
        delta = {
            REASONING: {"type": "thinking_delta", "thinking": text},
            TEXT: {"type": "text_delta", "text": text},
        }.get(kind) or {"type": "input_json_delta", "partial_json": text}
        return _event("content_block_delta", {"index": self.blocks - 1, "delta": delta})

    def _closed(self, kind: str) -> list[bytes]:
        events = []
        if kind == REASONING:  # the thinking's signature (_block)
            delta = {"type": "signature_delta", "signature": uuid.uuid4().hex}
            events.append(_event("content_block_delta", {"index": self.blocks - 1, "delta": delta}))
        events.append(_event("content_block_stop", {"index": self.blocks - 1}))
        return events

    def usage_chunk(self, choices: Choices) -> bytes:
        stream = choices.streams[0]
        reason, sequence = stop_reason(stream.finish, stream.stop_reason, list(self.arguments.values()))
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        usage = self._message_usage(stream)
        return _event("message_delta", {"delta": delta, "usage": usage}) + _event("message_stop", {})

    def _answer(self, stream: RequestStream, blocks: list[Block]) -> bytes:
        content = [self._block(*block) for block in blocks] or [self._block(TEXT, "")]  # Anthropic's empty answer
        calls = [arguments for kind, arguments, _, _ in blocks if kind == TOOL_CALL]
        reason, sequence = stop_reason(stream.finish, stream.stop_reason, calls)
        return msgspec.json.encode(
            MessageBody(self.rid, self.model, content, reason, sequence, self._message_usage(stream))
        )
