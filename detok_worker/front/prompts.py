"""Prompt ids for a request, as vLLM builds them.

/v1/completions: a string prompt is encoded with add_special_tokens=True (the request may override it); a token-id
prompt is used as is. /v1/chat/completions: the messages are rendered with the tokenizer's chat template
(add_generation_prompt=True by default) and the text is encoded with add_special_tokens=False (the template
writes the special tokens itself).

Chat messages reach the template as the client sent them (extra keys such as tool_calls, tool_call_id or
reasoning_content included), except that list-of-parts content is flattened to a string (the text parts joined
with "\\n", like vLLM for string-content templates), a null content (an assistant's, or a named function
message's: vLLM refuses it elsewhere) becomes "", and an assistant message's tool calls carry their arguments as
objects (vLLM's server decodes the JSON strings clients send). A developer message becomes a system one where the
template has no developer role (the tokenizer's ChatTemplates.render).

Length limits (front.max_prompt_chars, checked before any encoding, and the prompt-token limit, checked on the
ids) refuse a prompt with a 400 naming the field ("prompt" or "messages").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from detok_worker.front.errors import bad_request
from detok_worker.front.openai_api import ChatCompletionRequest, CompletionRequest
from detok_worker.front.validation import Limits, check_prompt_chars, check_prompt_tokens, check_token_ids
from detok_worker.tokenizer.protocol import Tokenizer, TokenizerError

# Names the renderer binds itself; a chat_template_kwargs entry may not shadow them.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "special_tokens",
        "template_name",
    }
)


def encode_text(tokenizer: Tokenizer, text: str, add_special_tokens: bool, param: str) -> list[int]:
    try:
        return tokenizer.encode_ids(text, add_special_tokens=add_special_tokens)
    except (TokenizerError, ValueError, UnicodeError) as exc:
        raise bad_request(f"the {param} cannot be tokenized: {exc}", param) from exc


def _non_empty(ids: list[int], param: str) -> list[int]:
    if not ids:
        raise bad_request(f"the {param} is empty (no tokens)", param)
    return ids


def _single_prompt(request: CompletionRequest) -> Any:
    prompt: Any = request.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return prompt[0]  # OpenAI's batch form with a single prompt
    return prompt


def prompt_chars(request: CompletionRequest | ChatCompletionRequest) -> int | None:
    """The size of a prompt's work before it is done: the characters of a string prompt or of the messages'
    string contents, the ids of a token-id prompt; None when not cheap to tell (list-of-parts content, tools or
    documents, which the template renders into the prompt: often many kilobytes)."""
    if isinstance(request, CompletionRequest):
        prompt = _single_prompt(request)
        return len(prompt)
    if request.tools or request.documents:
        return None
    size = 0
    for message in request.messages:
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            return None
        size += len(content or "")
    return size


def echo_text(request: CompletionRequest, ids: list[int], tokenizer: Tokenizer) -> str:
    """What echo prepends: a string prompt as the client sent it (even when truncate_prompt_tokens cut its ids,
    as vLLM does); a token-id prompt decoded, special tokens included."""
    prompt = _single_prompt(request)
    return prompt if isinstance(prompt, str) else tokenizer.decode(ids, skip_special_tokens=False)


def chat_echo_text(request: ChatCompletionRequest, role: str) -> str:
    """What a chat `echo` puts before each choice's content (vLLM's): the last message's content when that message
    has the answer's role (a list of parts: their texts, one a line), else nothing."""
    last = request.messages[-1] if request.messages else None
    if not isinstance(last, dict) or last.get("role") != role:
        return ""
    content = last.get("content") or ""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def completion_prompt_ids(request: CompletionRequest, tokenizer: Tokenizer, limits: Limits) -> list[int]:
    prompt = _single_prompt(request)
    if isinstance(prompt, str):
        check_prompt_chars(len(prompt), limits, "prompt")
        add_special = True if request.add_special_tokens is None else request.add_special_tokens
        ids = encode_text(tokenizer, prompt, add_special, "prompt")
        check_prompt_tokens(ids, limits, "prompt")
        return _non_empty(ids, "prompt")
    if not all(isinstance(item, int) for item in prompt):
        raise bad_request("prompt must be a string, a list of token ids, or a list holding one of those", "prompt")
    check_prompt_tokens(prompt, limits, "prompt")
    check_token_ids(prompt, limits, "prompt")
    return _non_empty(list(prompt), "prompt")


def _flatten_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"messages[{index}].content must be a string or a list of content parts", "messages")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad_request(f"messages[{index}]: only text content parts are supported (got {kind!r})", "messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not messages:
        raise bad_request("messages must contain at least one message", "messages")
    result = []
    for index, message in enumerate(messages):
        role = message.get("role")
        if not isinstance(role, str) or not role:  # any other role goes to the template, as in vLLM's server
            raise bad_request(f"messages[{index}].role must be a non-empty string (got {role!r})", "messages")
        if "tool_calls" in message and not (
            message["tool_calls"] is None
            or (isinstance(message["tool_calls"], list) and all(isinstance(c, dict) for c in message["tool_calls"]))
        ):
            raise bad_request(f"messages[{index}].tool_calls must be a list of objects", "messages")
        if "content" in message and message["content"] is None and not _null_content_allowed(message):
            raise bad_request(
                f"messages[{index}].content must be a string or a list of content parts; null is allowed in an "
                "assistant message (and a function message with a name) only",
                "messages",
            )
        prepared = {**message, "content": _flatten_content(message.get("content"), index)}
        if role == "assistant" and isinstance(message.get("tool_calls"), list):
            calls = [_template_tool_call(call, index) for call in message["tool_calls"]]
            if calls:
                prepared["tool_calls"] = calls
            else:  # an empty list keeps the template on its plain assistant path
                del prepared["tool_calls"]
        result.append(prepared)
    return result


def _null_content_allowed(message: dict[str, Any]) -> bool:
    """vLLM's server validates messages as OpenAI's message types or its own any-role type: only the assistant's
    and the function message's (which needs a name) take a null content; the others need a string or parts when
    the key is there (a message without content is any-role's)."""
    role = message.get("role")
    return role == "assistant" or (role == "function" and isinstance(message.get("name"), str))


def _template_tool_call(call: dict[str, Any], index: int) -> dict[str, Any]:
    """An assistant message's tool call as vLLM's server gives it to the template: its arguments as an object (a
    JSON string decoded; none, or a string that is not a JSON object, as {}: a bad call in the history must not fail
    every later turn), so the template writes them in its own way."""
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, dict):
        raise bad_request(f"messages[{index}].tool_calls: only calls of type 'function' are supported", "messages")
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = None
    return {**call, "function": {**function, "arguments": arguments if isinstance(arguments, dict) else {}}}


def merged_template_kwargs(request: ChatCompletionRequest, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The request's chat_template_kwargs over the server's (front.chat_template_kwargs), as vLLM merges them."""
    return {**defaults, **(request.chat_template_kwargs or {})}


def _template_kwargs(request: ChatCompletionRequest, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The template's arguments (merged_template_kwargs), none shadowing the renderer's own, reasoning_effort added."""
    kwargs = merged_template_kwargs(request, defaults)
    reserved = RESERVED_TEMPLATE_KWARGS.intersection(kwargs)
    if reserved:
        raise bad_request(f"chat_template_kwargs may not set {sorted(reserved)}", "chat_template_kwargs")
    if request.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", request.reasoning_effort)
    return kwargs


def function_tool(name: Any, description: Any, parameters: Any, strict: Any = None) -> dict[str, Any]:
    """A function tool in vLLM's server's shape (its request model dumped): `{"type", "function": {"name",
    "description", "parameters", "strict"}}` in that order, strict only when given."""
    function = {"name": name, "description": description, "parameters": parameters}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """An assistant message's tool call, as a chat request gives it (its arguments: JSON text)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def template_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools as the chat template sees them: a function tool as `function_tool` shapes it (description and
    parameters null when not given, other fields dropped); other tools as given."""
    if tools is None:
        return None
    shaped = []
    for tool in tools:
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            shaped.append(tool)
            continue
        fields = (function.get(name) for name in ("name", "description", "parameters", "strict"))
        shaped.append(function_tool(*fields))
    return shaped


def chat_prompt_text(request: ChatCompletionRequest, tokenizer: Tokenizer, limits: Limits) -> str:
    """The prompt the chat template renders for the request (vLLM's return_prompt_text gives it back)."""
    messages = _template_messages(request.messages)
    check_prompt_chars(sum(len(message["content"]) for message in messages), limits, "messages")
    excluded = request.tool_choice == "none" and limits.exclude_tools_when_tool_choice_none
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=None if excluded else template_tools(request.tools),
            documents=request.documents,
            add_generation_prompt=request.add_generation_prompt is not False,  # null = the default, true
            continue_final_message=bool(request.continue_final_message),
            **_template_kwargs(request, limits.chat_template_kwargs),
        )
    except TokenizerError as exc:  # ChatTemplateError, or a backend's own "no chat template" error
        raise bad_request(str(exc), "messages", code="chat_template_error") from exc
    check_prompt_chars(len(text), limits, "messages")  # the rendered text: a template may add a lot
    return text


def chat_prompt_ids(request: ChatCompletionRequest, tokenizer: Tokenizer, limits: Limits) -> list[int]:
    text = chat_prompt_text(request, tokenizer, limits)
    add_special = bool(request.add_special_tokens)
    ids = encode_text(tokenizer, text, add_special, "rendered chat")
    check_prompt_tokens(ids, limits, "messages")
    return _non_empty(ids, "messages")
