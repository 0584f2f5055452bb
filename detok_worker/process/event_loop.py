"""The asyncio event loop of detok's asyncio processes (the gRPC gateway, the engine server; the front's is
uvicorn's, which picks uvloop the same way): uvloop when it is installed (a dependency except on Windows), else
asyncio's own. grpc.aio runs on any asyncio loop, and on uvloop a Generate stream's message costs less CPU, in a bare
client and in the gateway's process."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
