"""A bare uvicorn SSE server, the yardstick of bench_http.py --per-chunk: a raw ASGI app (no framework) that
answers each POST with the SSE events `detok serve` sent for one real completion (the next of the completions in
`--events`, in turn), one text event per `--step-ms` (the engine's pace), then the closing events at once. Same
uvicorn, loop and HTTP implementation as the front, so the difference in CPU per chunk is what the front does beyond
writing the bytes.

    python bench/bare_sse.py --events FILE --step-ms 20 [--http httptools] [--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import uvicorn
from sse_client import is_text

HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


def sse_app(completions: list[list[bytes]], step_s: float) -> Any:
    """The ASGI app: replays the completions in turn, each a list of whole SSE events (`data: ...\\n\\n`),
    sleeping step_s before each text event."""
    replays = [[(event, is_text(event) and b'"usage":{' not in event) for event in events] for events in completions]
    served = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal served
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        while (await receive()).get("more_body"):
            pass
        replay = replays[served % len(replays)]
        served += 1
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        for event, wait in replay:
            if wait and step_s:
                await asyncio.sleep(step_s)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", required=True, help="JSON list of completions, each a list of SSE events")
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--http", default="httptools", choices=["h11", "httptools"])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    completions = [[event.encode() for event in events] for events in json.loads(Path(args.events).read_text())]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print(f"serving at http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        sse_app(completions, args.step_ms / 1000),
        loop="uvloop",
        http=args.http,
        lifespan="on",
        log_config=None,
        access_log=False,
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
