"""The front's OpenAPI 3.1 document, generated from the msgspec request/response structs (for clients, API
explorers and schema-driven fuzzers such as schemathesis)."""

from __future__ import annotations

from functools import cache
from typing import Any

import msgspec

from detok_worker.front.anthropic_api import (
    AnthropicErrorBody,
    CountTokensRequest,
    CountTokensResponse,
    MessageBody,
    MessagesRequest,
)
from detok_worker.front.errors import ErrorBody
from detok_worker.front.openai_api import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
)
from detok_worker.front.openai_responses import ResponsesRequest

_REF = "#/components/schemas/{name}"
_ERROR_STATUSES = ("400", "401", "404", "413", "502", "503", "504")


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _json(schema: dict[str, Any], description: str = "JSON") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _post(summary: str, request: str, ok: dict[str, Any], error: str = "ErrorBody") -> dict[str, Any]:
    """A POST path item: its JSON body `request`, its 200 answer `ok`, an `error` body for each error status."""
    responses = {"200": ok, **{status: _json(_ref(error), "error") for status in _ERROR_STATUSES}}
    body = {"required": True, "content": {"application/json": {"schema": _ref(request)}}}
    return {"post": {"summary": summary, "requestBody": body, "responses": responses}}


def _streamed(schema: dict[str, Any], events: str) -> dict[str, Any]:
    """A generation's 200: a JSON body, or (stream) a text/event-stream of `events`."""
    return {
        "description": "the answer (JSON), or a text/event-stream of its events when stream is true",
        "content": {
            "application/json": {"schema": schema},
            "text/event-stream": {"schema": {"type": "string", "description": events}},
        },
    }


@cache
def openapi_document(title: str) -> dict[str, Any]:
    types = [
        CompletionRequest,
        CompletionResponse,
        ChatCompletionRequest,
        ChatCompletionResponse,
        ChatCompletionChunk,
        ModelList,
        ErrorBody,
        MessagesRequest,
        MessageBody,
        CountTokensRequest,
        CountTokensResponse,
        AnthropicErrorBody,
        ResponsesRequest,
    ]
    _, components = msgspec.json.schema_components(types, ref_template=_REF)
    plain_json = {"type": "object"}
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": {
            "/v1/completions": _post(
                "text completion",
                "CompletionRequest",
                _streamed(_ref("CompletionResponse"), "data: <CompletionResponse>"),
            ),
            "/v1/chat/completions": _post(
                "chat completion",
                "ChatCompletionRequest",
                _streamed(_ref("ChatCompletionResponse"), "data: <ChatCompletionChunk>"),
            ),
            "/v1/responses": _post(
                "OpenAI's Responses API", "ResponsesRequest", _streamed(plain_json, "OpenAI's Responses events")
            ),
            "/v1/messages": _post(
                "Anthropic's Messages API",
                "MessagesRequest",
                _streamed(_ref("MessageBody"), "Anthropic's Messages events"),
                "AnthropicErrorBody",
            ),
            "/v1/messages/count_tokens": _post(
                "a Messages request's prompt tokens",
                "CountTokensRequest",
                _json(_ref("CountTokensResponse")),
                "AnthropicErrorBody",
            ),
            "/v1/models": {"get": {"summary": "served models", "responses": {"200": _json(_ref("ModelList"))}}},
            "/health": {
                "get": {"summary": "readiness", "responses": {"200": _json(plain_json), "503": _json(plain_json)}}
            },
            "/stats": {"get": {"summary": "live counters", "responses": {"200": _json(plain_json)}}},
        },
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
