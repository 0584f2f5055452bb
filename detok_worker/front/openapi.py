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


def _generation(request: str, response: str, chunk: str, summary: str, error: str = "ErrorBody") -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {
            "description": "the completion (JSON), or a text/event-stream of chunks when stream is true",
            "content": {
                "application/json": {"schema": _ref(response)},
                "text/event-stream": {"schema": {"type": "string", "description": f"data: <{chunk}> events"}},
            },
        }
    }
    responses.update({status: _json(_ref(error), "error") for status in _ERROR_STATUSES})
    return {"post": {"summary": summary, "requestBody": _body(request), "responses": responses}}


def _body(request: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(request)}}}


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
            "/v1/completions": _generation(
                "CompletionRequest", "CompletionResponse", "CompletionResponse", "text completion"
            ),
            "/v1/chat/completions": _generation(
                "ChatCompletionRequest", "ChatCompletionResponse", "ChatCompletionChunk", "chat completion"
            ),
            "/v1/responses": {
                "post": {
                    "summary": "OpenAI's Responses API",
                    "requestBody": _body("ResponsesRequest"),
                    "responses": {
                        "200": {
                            "description": "the response (JSON), or a text/event-stream of its events (stream)",
                            "content": {
                                "application/json": {"schema": plain_json},
                                "text/event-stream": {"schema": {"type": "string"}},
                            },
                        },
                        **{status: _json(_ref("ErrorBody"), "error") for status in _ERROR_STATUSES},
                    },
                }
            },
            "/v1/messages": _generation(
                "MessagesRequest", "MessageBody", "Anthropic's", "Anthropic's Messages API", "AnthropicErrorBody"
            ),
            "/v1/messages/count_tokens": {
                "post": {
                    "summary": "a Messages request's prompt tokens",
                    "requestBody": _body("CountTokensRequest"),
                    "responses": {
                        "200": _json(_ref("CountTokensResponse")),
                        **{status: _json(_ref("AnthropicErrorBody"), "error") for status in _ERROR_STATUSES},
                    },
                }
            },
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
