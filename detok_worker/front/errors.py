"""OpenAI-style API errors: one exception type carrying the HTTP status and the `{"error": {...}}` body fields,
and its JSON response."""

from __future__ import annotations

import msgspec
from starlette.responses import Response

JSON = "application/json"
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVICE_UNAVAILABLE = "service_unavailable"
ENGINE_ERROR = "engine_error"
TIMEOUT = "timeout"
SERVER_ERROR = "server_error"


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


class APIError(Exception):
    """Raised anywhere in request handling; the app turns it into a JSON error response (or an SSE error event)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> ErrorBody:
        return ErrorBody(ErrorDetail(self.message, self.type, self.param, self.code))


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def encode_error(error: APIError) -> bytes:
    return msgspec.json.encode(error.body())


def error_response(error: APIError, headers: dict[str, str] | None = None) -> Response:
    """The JSON response of an error (a 401 also asks for a Bearer token)."""
    if error.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return Response(encode_error(error), status_code=error.status, media_type=JSON, headers=headers)
