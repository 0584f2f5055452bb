"""OpenAI-style API errors: one exception type carrying the HTTP status and the `{"error": {...}}` body fields,
and its JSON response."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from starlette.responses import Response

from detok_worker.bus.messages import REJECT_INVALID, REJECT_NO_WORKER, REJECT_STOP_BUDGET, Reject

JSON = "application/json"
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVICE_UNAVAILABLE = "service_unavailable"
ENGINE_ERROR = "engine_error"
TIMEOUT = "timeout"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"
STOP_BUDGET_RETRY_S = 1  # Retry-After of a request refused for the workers' stop-string budget: requests end often


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
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers  # of its response (e.g. Retry-After)

    def body(self) -> ErrorBody:
        return ErrorBody(ErrorDetail(self.message, self.type, self.param, self.code))


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def encode_error(error: APIError) -> bytes:
    return msgspec.json.encode(error.body())


def error_response(error: APIError, headers: dict[str, str] | None = None) -> Response:
    """The JSON response of an error, with its own headers (a 401 also asks for a Bearer token)."""
    if error.headers:
        headers = {**error.headers, **(headers or {})}
    if error.status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return Response(encode_error(error), status_code=error.status, media_type=JSON, headers=headers)


def reshaped_error(response: Any, reshape: Callable[[APIError, dict[str, str]], Response]) -> Any:
    """An error response of the chat path (status >= 400, an ErrorBody) as a route that answers a chat request's
    errors in its own shape or names gives it: `reshape` of the APIError it says and its headers (without the body's
    length and type); any other response (an answer, an event stream) as it is."""
    if not isinstance(response, Response) or response.status_code < 400:
        return response
    try:
        detail = msgspec.json.decode(bytes(response.body), type=ErrorBody).error
    except msgspec.DecodeError:
        return response
    error = APIError(response.status_code, detail.message, type=detail.type, param=detail.param, code=detail.code)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
    return reshape(error, headers)


def renamed_param(error: APIError, names: dict[str, str]) -> APIError:
    """`error` naming the field of another API's request that the chat request's field it names came from (`names`:
    chat field -> that API's), its message naming it too."""
    param = names.get(error.param or "", error.param)
    message = error.message if param is None or param in error.message else f"{error.message} ({param})"
    return APIError(error.status, message, type=error.type, param=param, code=error.code, headers=error.headers)


def reject_error(reject: Reject) -> tuple[APIError, bool]:
    """What the client is told of the engine's Reject, by its `param` and `kind` (never by its message), and whether
    it is a refusal at admission (the status of a response not started yet, rather than an error that ends one): a
    parameter the engine cannot honour or a request outside its limits is a 400, no room for its stop strings on
    any worker a 429 with Retry-After, no live worker a 503; a Reject that says no kind (the engine failed) a 503."""
    if reject.param:
        return bad_request(f"the engine cannot honour {reject.param}: {reject.error}", reject.param), True
    if reject.kind == REJECT_INVALID:
        return bad_request(f"the engine refused the request: {reject.error}", code="invalid_request"), True
    if reject.kind == REJECT_STOP_BUDGET:
        headers = {"Retry-After": str(STOP_BUDGET_RETRY_S)}
        error = APIError(429, reject.error, type=RATE_LIMIT, param="stop", code="stop_budget", headers=headers)
        return error, True
    return engine_failure(reject.error), reject.kind == REJECT_NO_WORKER


def engine_failure(message: str) -> APIError:
    """The engine could not take or finish the request (`message`: its words), told by its Reject or by the
    worker's final delta of the rid (TextExtras.engine_failed), the same whichever reaches the front first."""
    return APIError(503, f"the engine could not serve the request: {message}", type=SERVICE_UNAVAILABLE)
