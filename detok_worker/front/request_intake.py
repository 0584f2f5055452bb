"""What the routes of the front (app.py, generation.py) share before their own work: the API key check, the
size-capped read of a request body (413 over front.max_request_bytes), and the small thread pool that runs chat
templates, tokenizing and other CPU work off the event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

from detok_worker.config import FrontConfig
from detok_worker.front.api_key import resolve_api_keys
from detok_worker.front.errors import AUTHENTICATION, APIError

PROMPT_THREADS = 2  # chat templates and tokenizing of longer prompts run off the event loop
T = TypeVar("T")


class RequestIntake:
    def __init__(self, config: FrontConfig) -> None:
        self.config = config
        # keys compared as digests: equal length, so the time taken says nothing of any key
        self._key_digests = [_digest(key) for key in resolve_api_keys(config)]
        self._executor = ThreadPoolExecutor(PROMPT_THREADS, thread_name_prefix="front-prompt")

    def authorize(self, request: Request) -> None:
        if not self._key_digests:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        anthropic_key = request.headers.get("x-api-key") if getattr(request.state, "anthropic", False) else None
        if anthropic_key is not None:  # Anthropic's clients send their key in x-api-key
            scheme, token = "bearer", anthropic_key
        given = _digest(token.strip())
        matched = False
        for digest in self._key_digests:  # every key compared, so the time says nothing of which one matched
            matched |= hmac.compare_digest(given, digest)
        if scheme.lower() != "bearer" or not matched:
            raise APIError(401, "invalid or missing API key", type=AUTHENTICATION, code="invalid_api_key")

    async def read_body(self, request: Request) -> bytes:
        """The body, read once: a route that hands its request on (/invocations) leaves it in request.state.body."""
        read = getattr(request.state, "body", None)
        if read is not None:
            return read
        limit = self.config.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
        except ClientDisconnect as exc:  # nobody is left to read the answer; no need to log an error
            raise APIError(400, "the client disconnected while sending the request", code="disconnected") from exc
        return b"".join(chunks)

    async def off_loop(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()
