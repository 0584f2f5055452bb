"""OpenAI's Responses API (POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel) as another
shape of a chat request.

A Responses body is checked here (an unknown field, item or tool type is a 400 naming it), turned into the chat
request it means (`ResponsesIntake.to_chat`: `instructions` as the system message, the conversation of
`previous_response_id` from the store, the input items: messages, function calls and their outputs, reasoning),
and runs the chat path of generation.py: the same prompt rendering, stop rules, parsers and exactly-once delivery.
`ResponsesFormatter` shapes its answer: a `response` object whose output items are reasoning, a message and function
calls, or the streamed events (response.created, output items opened and closed, text, reasoning and arguments
deltas, response.completed). A stored response (`store`, the default) keeps its conversation for a later
`previous_response_id` and for GET, in this front process's `ResponseStore` (front.responses_store_max responses,
the oldest evicted first).
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from detok_worker.front.choices import Choices
from detok_worker.front.errors import APIError, bad_request, error_response, renamed_param, reshaped_error
from detok_worker.front.openai_api import ChatCompletionRequest, StreamOptions
from detok_worker.front.prompts import function_tool, tool_call
from detok_worker.front.request_stream import RequestStream
from detok_worker.front.responses import REASONING, TEXT, TOOL_CALL, Block, BlockFormatter, ChunkTemplate
from detok_worker.front.sse import named_event, named_events_framing
from detok_worker.front.validation import VLLM_SAMPLING_EPS, decode_json

# ---- requests ---------------------------------------------------------------------------------------------


class TextFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_schema", "json_object"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct, forbid_unknown_fields=True):
    format: TextFormat | None = None
    verbosity: Any = None  # refused when set


class ReasoningConfig(msgspec.Struct, forbid_unknown_fields=True):
    effort: str | None = None
    summary: Any = None  # refused when set: detok returns the reasoning itself, never a summary
    generate_summary: Any = None


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None  # null = true (OpenAI's default)
    stream: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # vLLM's
    min_p: float | None = None  # vLLM's
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    truncation: Literal["disabled"] | None = None  # "auto" (drop the conversation's start) is not done
    service_tier: Literal["auto", "default"] | None = None
    include: list[str] | None = None  # only [] (nothing extra to include)
    request_id: str | None = None  # vLLM's
    # refused when set
    background: Any = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None
    top_logprobs: Any = None
    stream_options: Any = None


_decoder = msgspec.json.Decoder(ResponsesRequest)
_REFUSED = ("background", "conversation", "prompt", "max_tool_calls", "top_logprobs", "stream_options")


def _content_text(content: Any, where: str) -> str | list[dict[str, str]]:
    """A message's content for the chat template: a string, or its text parts (input_text/output_text as text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request("a message's content must be a string or a list of parts", where)
    parts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise bad_request(
                f"{kind} content parts are not supported: this server takes text only", f"{where}[{index}]"
            )
        parts.append({"type": "text", "text": str(part.get("text", ""))})
    if len(parts) == 1:
        return parts[0]["text"]
    return parts


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages from Responses input items; an assistant's reasoning, text and function calls in a row make one
    assistant message (as vLLM's server merges them)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request("an input item must be an object", where)
        kind = item.get("type", "message")
        last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"unknown message role {role!r}", f"{where}.role")
            text = _content_text(item.get("content", ""), f"{where}.content")
            if role == "assistant" and last is not None and "content" not in last:
                last["content"] = text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = tool_call(str(item.get("call_id", "")), str(item.get("name", "")), str(item.get("arguments", "")))
            if last is not None:
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _content_text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": text})
        elif kind == "reasoning":
            if item.get("encrypted_content"):
                raise bad_request("encrypted reasoning is not supported", f"{where}.encrypted_content")
            parts = item.get("content") or item.get("summary") or []
            reasoning = "".join(str(part.get("text", "")) for part in parts if isinstance(part, dict))
            if last is not None and "reasoning" not in last and "content" not in last:
                last["reasoning"] = reasoning
            else:
                messages.append({"role": "assistant", "reasoning": reasoning})
        else:
            raise bad_request(f"{kind} input items are not supported", f"{where}.type")
    return messages


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for index, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise bad_request(
                f"{tool.get('type')} tools are not supported: only function tools", f"tools[{index}].type"
            )
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise bad_request(f"unknown tool fields {sorted(unknown)}", f"tools[{index}]")
        out.append(function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), tool.get("strict")))
    return out


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise bad_request(f"unknown tool_choice {choice!r}", "tool_choice")
        return choice
    if choice.get("type") != "function" or not choice.get("name"):
        raise bad_request("tool_choice must be auto, none, required or a function by name", "tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text_format: TextFormat) -> dict[str, Any] | None:
    if text_format.type == "text":
        return None
    if text_format.type == "json_object":
        return {"type": "json_object"}
    schema = {"name": text_format.name or "response", "schema": text_format.schema or {}}
    if text_format.strict is not None:
        schema["strict"] = text_format.strict
    return {"type": "json_schema", "json_schema": schema}


# ---- the store ----------------------------------------------------------------------------------------------


class StoredResponse(msgspec.Struct):
    """A finished stored response: its body (for GET) and its whole conversation (for previous_response_id)."""

    body: bytes
    conversation: list[dict[str, Any]]


class ResponseStore:
    """The responses kept for previous_response_id and GET, in one front process: at most `capacity`, the oldest
    evicted first (0: none kept). A response is kept once it has finished."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.capacity <= 0:
            return
        self._kept[response_id] = stored
        self._kept.move_to_end(response_id)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse:
        stored = self._kept.get(response_id)
        if stored is None:
            raise APIError(404, f"no stored response with id {response_id!r}", code="not_found")
        return stored


# the chat request's fields a refusal may name, as the Responses fields they come from
_FIELD_NAMES = {
    "max_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}


def responses_error(error: APIError) -> APIError:
    """A refusal of the chat request a Responses request became, naming the Responses request's field."""
    return renamed_param(error, _FIELD_NAMES)


def responses_error_response(response: Any) -> Any:
    """An error response of the chat path naming the Responses request's field; any other response as it is."""
    return reshaped_error(response, lambda error, headers: error_response(responses_error(error), headers))


def decode_responses(body: bytes, store: ResponseStore) -> tuple[ChatCompletionRequest, ResponsesRequest]:
    """A /v1/responses body as the chat request it means, and the request itself (its echo in the response)."""
    request: ResponsesRequest = decode_json(_decoder, body)
    for name in _REFUSED:
        if getattr(request, name) not in (None, False, 0):
            raise bad_request(f"{name} is not supported", name)
    if request.store is True and store.capacity <= 0:
        raise bad_request("store is off on this server (front.responses_store_max = 0)", "store")
    if request.include:
        raise bad_request("include is not supported (nothing extra can be included)", "include")
    if request.text is not None and request.text.verbosity is not None:
        raise bad_request("text.verbosity is not supported", "text.verbosity")
    if request.reasoning is not None and (request.reasoning.summary or request.reasoning.generate_summary):
        raise bad_request("reasoning summaries are not supported: the reasoning itself is returned", "reasoning")
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if request.previous_response_id is not None:  # instructions do not carry over (OpenAI's rule)
        previous = store.get(request.previous_response_id).conversation
        messages += [message for message in previous if message.get("role") not in ("system", "developer")]
    messages += input_messages(request.input)
    chat = ChatCompletionRequest(
        model=request.model, messages=messages, max_tokens=request.max_output_tokens,
        temperature=request.temperature, top_p=request.top_p, top_k=request.top_k, min_p=request.min_p,
        presence_penalty=request.presence_penalty, frequency_penalty=request.frequency_penalty,
        logit_bias=request.logit_bias, parallel_tool_calls=request.parallel_tool_calls, user=request.user,
        request_id=request.request_id, metadata=request.metadata, safety_identifier=request.safety_identifier,
        prompt_cache_key=request.prompt_cache_key,
    )  # fmt: skip
    if request.tools:
        chat.tools = _tools(request.tools)
        chat.tool_choice = "auto"
    if request.tool_choice is not None:
        chat.tool_choice = _tool_choice(request.tool_choice)
    if request.text is not None and request.text.format is not None:
        chat.response_format = _response_format(request.text.format)
    if request.reasoning is not None:
        chat.reasoning_effort = request.reasoning.effort
    if request.stream:
        chat.stream = True
        chat.stream_options = StreamOptions(include_usage=True)  # the usage goes on response.completed
    return chat, request


# ---- responses --------------------------------------------------------------------------------------------


class ResponsesFormatter(BlockFormatter):
    """A Responses answer from a chat request's output (one choice): output items reasoning, message and
    function_call, streamed as output_item.added, deltas and the done events, every event numbered
    (sequence_number)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request: ResponsesRequest | None = None
        self.conversation: list[dict[str, Any]] = []
        self.store: ResponseStore | None = None
        self.framing = named_events_framing(self._error_event)
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # the output items so far (the last may be open)
        self.vllm_shape = False  # the response object as vLLM's server writes it (`--source vllm`)
        self.context_length: int | None = None  # the model's max_model_len, when known (vLLM's max_output_tokens)
        self.sampling_defaults: Mapping[str, int | float] = {}  # the model's (EngineStats), echoed as vLLM's does

    def bind(
        self,
        request: ResponsesRequest,
        conversation: list[dict[str, Any]],
        store: ResponseStore,
        vllm_shape: bool = False,
        context_length: int | None = None,
        sampling_defaults: Mapping[str, int | float] | None = None,
    ) -> None:
        """The request it answers (echoed in the response) and its conversation, kept in `store` when it asked;
        `vllm_shape`: the response object is vLLM's server's (its fields, its echo of the request, with the model's
        `sampling_defaults` where the request leaves a field out)."""
        self.request, self.conversation, self.store = request, conversation, store
        self.vllm_shape, self.context_length = vllm_shape, context_length
        self.sampling_defaults = sampling_defaults or {}

    def _event(self, kind: str, payload: dict[str, Any], number: str | None = None) -> bytes:
        """An event numbered next (or `number`: a template's mark, which takes no number of the sequence)."""
        if number is None:
            self._sequence += 1
            number = self._sequence - 1
        return named_event(kind, msgspec.json.encode({"type": kind, "sequence_number": number, **payload}))

    def _error_event(self, error: APIError) -> bytes:
        """The event that ends a stream that failed after it started (OpenAI's `error` event)."""
        error = responses_error(error)
        return self._event("error", {"code": error.code, "message": error.message, "param": error.param})

    def _response(self, stream: RequestStream, output: list[dict[str, Any]], status: str) -> dict[str, Any]:
        request = self.request or ResponsesRequest(input="")
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        usage = None
        if status != "in_progress":
            read, written = stream.cached_tokens or (0, 0)
            # vLLM's server's shape: OpenAI's fields, its cache writes, and per-turn lists (one turn: none)
            usage = {
                "input_tokens": stream.prompt_tokens,
                "input_tokens_details": {
                    "cached_tokens": read, "cache_write_tokens": written,
                    "input_tokens_per_turn": [], "cached_tokens_per_turn": [],
                },
                "output_tokens": stream.n_tokens,
                "output_tokens_details": {
                    "reasoning_tokens": stream.reasoning_tokens, "tool_output_tokens": 0,
                    "output_tokens_per_turn": [], "tool_output_tokens_per_turn": [],
                },
                "total_tokens": stream.prompt_tokens + stream.n_tokens,
            }  # fmt: skip
        response = {
            "id": self.rid, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": output, "usage": usage, "incomplete_details": incomplete,
            "instructions": request.instructions, "previous_response_id": request.previous_response_id,
            "parallel_tool_calls": request.parallel_tool_calls is not False, "temperature": request.temperature,
            "tools": request.tools or [], "background": False, "truncation": "disabled", "user": request.user,
        }  # fmt: skip
        if self.vllm_shape:
            echo = _vllm_echo(request, stream.prompt_tokens, self.context_length, self.sampling_defaults)
            return {**response, **echo}
        text_format = request.text.format if request.text is not None and request.text.format is not None else None
        return {
            **response, "error": None, "max_output_tokens": request.max_output_tokens,
            "metadata": request.metadata or {}, "top_p": request.top_p, "tool_choice": request.tool_choice or "auto",
            "text": {"format": msgspec.to_builtins(text_format) if text_format else {"type": "text"}},
            "reasoning": {"effort": request.reasoning.effort if request.reasoning else None, "summary": None},
            "store": request.store is not False,
        }  # fmt: skip

    def first_chunks(self, index: int, stream: RequestStream) -> list[bytes]:
        response = self._response(stream, [], "in_progress")
        return [
            self._event("response.created", {"response": response}),
            self._event("response.in_progress", {"response": response}),
        ]

    def _opened(self, kind: str, name: str, call_id: str) -> list[bytes]:
        output = self.blocks - 1
        item = self._item(kind, name, call_id)
        self._items.append(item)
        added = {"output_index": output, "item": {**item, "status": "in_progress"}}
        events = [self._event("response.output_item.added", added)]
        if kind != TOOL_CALL:
            where = {"item_id": item["id"], "output_index": output, "content_index": 0}
            events.append(self._event("response.content_part.added", {**where, "part": _part(kind, "")}))
        return events

    def _delta_event(self, kind: str, text: str, number: str) -> bytes:
        where: dict[str, Any] = {"item_id": self._items[-1]["id"], "output_index": self.blocks - 1}
        if kind == TOOL_CALL:
            return self._event("response.function_call_arguments.delta", {**where, "delta": text}, number)
        if kind == REASONING:
            return self._event("response.reasoning_text.delta", {**where, "content_index": 0, "delta": text}, number)
        payload = {**where, "content_index": 0, "delta": text, "logprobs": []}
        return self._event("response.output_text.delta", payload, number)

    def _filled(self, template: ChunkTemplate, text: str) -> bytes:
        self._sequence += 1
        return template.fill_numbered(text, self._sequence - 1)

    def _closed(self, kind: str) -> list[bytes]:
        item, text = self._items[-1], "".join(self.block_pieces)
        self._complete(item, kind, text)
        where = {"item_id": item["id"], "output_index": self.blocks - 1}
        if kind == TOOL_CALL:
            events = [
                self._event("response.function_call_arguments.done", {**where, "arguments": text, "name": item["name"]})
            ]
        else:
            done = "response.reasoning_text.done" if kind == REASONING else "response.output_text.done"
            extra = {} if kind == REASONING else {"logprobs": []}
            events = [
                self._event(done, {**where, "content_index": 0, "text": text, **extra}),
                self._event("response.content_part.done", {**where, "content_index": 0, "part": item["content"][0]}),
            ]
        item["status"] = "completed"
        events.append(self._event("response.output_item.done", {"output_index": self.blocks - 1, "item": item}))
        return events

    def _item(self, kind: str, name: str, call_id: str) -> dict[str, Any]:
        """An output item as it opens; vLLM's server's messages carry OpenAI's `phase` (null)."""
        item = _item(kind, name, call_id)
        if self.vllm_shape and kind == TEXT:
            item["phase"] = None
        return item

    def _complete(self, item: dict[str, Any], kind: str, text: str) -> None:
        """An item with its whole text (_complete); vLLM's server gives a finished message's text part null
        logprobs (its streamed events' parts have [] until then)."""
        _complete(item, kind, text)
        if self.vllm_shape and kind == TEXT:
            item["content"][0]["logprobs"] = None

    def _status(self, stream: RequestStream) -> str:
        return "incomplete" if stream.finish == "length" else "completed"

    def usage_chunk(self, choices: Choices) -> bytes:
        stream = choices.streams[0]
        response = self._response(stream, self._items, self._status(stream))
        self._keep(response)
        return self._event("response.completed", {"response": response})

    def _answer(self, stream: RequestStream, blocks: list[Block]) -> bytes:
        output = []
        for kind, text, name, call_id in blocks:
            item = self._item(kind, name, call_id)
            self._complete(item, kind, text)
            if kind != REASONING:  # a whole answer's reasoning item has no status (vLLM's server)
                item["status"] = "completed"
            output.append(item)
        response = self._response(stream, output, self._status(stream))
        self._keep(response)
        return msgspec.json.encode(response)

    def _keep(self, response: dict[str, Any]) -> None:
        """A finished response into the store (when asked): its body, and its conversation with the answer as one
        assistant message."""
        if self.store is None or (self.request is not None and self.request.store is False):
            return
        answer: dict[str, Any] = {"role": "assistant"}
        for item in response["output"]:
            if item["type"] == "reasoning":
                answer["reasoning"] = item["content"][0]["text"]
            elif item["type"] == "message":
                answer["content"] = item["content"][0]["text"] if item["content"] else ""
            else:
                answer.setdefault("tool_calls", []).append(tool_call(item["call_id"], item["name"], item["arguments"]))
        conversation = [*self.conversation, answer]
        self.store.put(self.rid, StoredResponse(msgspec.json.encode(response), conversation))


def _vllm_echo(
    request: ResponsesRequest, prompt_tokens: int, context_length: int | None, defaults: Mapping[str, int | float]
) -> dict[str, Any]:
    """The response fields vLLM's server fills from the request and its sampling parameters (its
    ResponsesResponse.from_request): a sampling field the request leaves out is the model's default (`defaults`, its
    generation config's, which the engine reports), else vLLM's own (temperature and top_p 1, penalties 0); a greedy
    temperature sets top_p to 1 (vLLM's SamplingParams); without tools an `auto` or no tool_choice is "none";
    max_output_tokens is the asked number, else the model's default, at most the rest of the context (a generation
    config directory's max_new_tokens, which caps an asked number too in vLLM's server, is not seen here)."""
    temperature = _given_or(request.temperature, defaults, "temperature", 1.0)
    rest = context_length - prompt_tokens if context_length else None
    asked = request.max_output_tokens if request.max_output_tokens is not None else defaults.get("max_tokens")
    if asked is not None:
        asked = int(asked)
    text = None
    if request.text is not None:
        text_format = request.text.format
        shown = {k: v for k, v in msgspec.to_builtins(text_format).items() if v is not None} if text_format else None
        text = {"format": shown, "verbosity": None}
    no_tools = not request.tools and request.tool_choice in (None, "auto", "none")
    return {
        "metadata": request.metadata,
        "tool_choice": "none" if no_tools else request.tool_choice or "auto",
        "temperature": temperature,
        "top_p": 1.0 if temperature < VLLM_SAMPLING_EPS else _given_or(request.top_p, defaults, "top_p", 1.0),
        "max_output_tokens": asked if rest is None else rest if asked is None else min(asked, rest),
        "max_tool_calls": None,
        "prompt": None,
        "reasoning": msgspec.to_builtins(request.reasoning) if request.reasoning is not None else None,
        "service_tier": request.service_tier or "auto",
        "text": text,
        "top_logprobs": None,
        "presence_penalty": _given_or(request.presence_penalty, defaults, "presence_penalty", 0.0),
        "frequency_penalty": _given_or(request.frequency_penalty, defaults, "frequency_penalty", 0.0),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "input_messages": None,
        "output_messages": None,
    }


def _given_or(value: float | None, defaults: Mapping[str, int | float], name: str, fallback: float) -> float:
    """A sampling field as vLLM's server fills it: the request's, else the model's default, else vLLM's own."""
    return value if value is not None else defaults.get(name, fallback)


def _item(kind: str, name: str = "", call_id: str = "") -> dict[str, Any]:
    """An output item as it opens: a reasoning item, a message, or a function call (`name`, `call_id`)."""
    if kind == REASONING:
        return {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": []}
    if kind == TEXT:
        return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "content": []}
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call_id, "name": name, "arguments": ""}


def _part(kind: str, text: str) -> dict[str, Any]:
    """The content part of a reasoning item or a message."""
    if kind == REASONING:
        return {"type": "reasoning_text", "text": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _complete(item: dict[str, Any], kind: str, text: str) -> None:
    """An item with its whole text: a function call's arguments, else its one content part."""
    if kind == TOOL_CALL:
        item["arguments"] = text
    else:
        item["content"] = [_part(kind, text)]
