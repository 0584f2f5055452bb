"""The front process: serves the app (app.py) with uvicorn (uvloop when installed) on config.front.host:port
until SIGINT/SIGTERM, then drains and exits cleanly.

The first SIGINT/SIGTERM starts a drain (Front.drain): the listener stays open so new requests get a 503 with
Retry-After and /health says "draining"; live requests may finish for up to front.drain_timeout_s, the rest end
with an error event; then uvicorn shuts down. A second signal exits at once. HTTP limits (head/body deadlines,
connection cap, open-file limit): edge.py.

With front.processes > 1 each front process binds its own listening socket on host:port with SO_REUSEPORT: Linux
hashes each new connection to one of the listening sockets, so the fronts share the load with no accept herd.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from types import FrameType
from typing import Any

import uvicorn

from detok_worker.config import DetokConfig, FrontConfig
from detok_worker.front.app import Front, create_app
from detok_worker.front.edge import connection_cap, guarded_protocol, raise_fd_limit
from detok_worker.metrics import observe_tokenizer_load
from detok_worker.process.runtime import stop_on_signals
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer

GRACEFUL_SHUTDOWN_S = 1.0  # after the drain: connections get this long to close before their tasks are cancelled
TICK_S = 1.0  # uvicorn's per-second work (the Date header); an exit request wakes the loop at once


class DrainingServer(uvicorn.Server):
    """uvicorn's server, except that the first stop signal drains the front before shutting down."""

    def __init__(self, config: uvicorn.Config, front: Front) -> None:
        # before uvicorn's __init__, which sets should_exit (the setter below reads these)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_requested = asyncio.Event()
        super().__init__(config)
        self.front = front
        self._drain: asyncio.Task[None] | None = None

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Set by signal handlers, the drain and other threads: wakes `main_loop` (thread-safe)."""
        self._should_exit = value
        if value and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self._exit_requested.set)

    async def startup(self, sockets: list | None = None) -> None:  # type: ignore[type-arg]
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def main_loop(self) -> None:
        """uvicorn's own loop wakes ten times a second to look at should_exit; this one waits for it, and wakes
        once a second for on_tick's per-second work (its counter is a multiple of 10 at every call)."""
        counter = 0
        while not await self.on_tick(counter):
            counter += 10
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._exit_requested.wait(), TICK_S)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain is not None:  # not serving yet, or a second signal: stop now
            self.force_exit = self._drain is not None
            super().handle_exit(sig, frame)
            return
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await self.front.drain()
        finally:
            self.should_exit = True


def reuse_port_listener(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on host:port that other front processes can bind too (SO_REUSEPORT)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    listener = socket.socket(family, kind, proto)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(address)
        listener.listen(backlog)
    except OSError:
        listener.close()
        raise
    listener.set_inheritable(True)
    return listener


def tls_options(front: FrontConfig) -> dict[str, Any]:
    """uvicorn's TLS settings from front.ssl_* (none: plain HTTP)."""
    if not front.ssl_certfile:
        return {}
    options: dict[str, Any] = {
        "ssl_keyfile": front.ssl_keyfile,
        "ssl_certfile": front.ssl_certfile,
        "ssl_cert_reqs": front.ssl_cert_reqs,
        "ssl_ca_certs": front.ssl_ca_certs or None,
    }
    if front.ssl_ciphers:
        options["ssl_ciphers"] = front.ssl_ciphers
    return options


def run_front(config: DetokConfig, tokenizer: Tokenizer | None = None, index: int = 0) -> None:
    """Serve the front on config.front.host:port; blocks until SIGINT/SIGTERM (and the drain) end it. `index`:
    which of the front.processes front processes this is."""
    if tokenizer is None:
        start = time.perf_counter()
        tokenizer = load_configured_tokenizer(config, eager=True)  # every request encodes
        observe_tokenizer_load(tokenizer, time.perf_counter() - start, "front")
    app = create_app(config, tokenizer, index)
    max_connections = connection_cap(config.front, raise_fd_limit())
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=config.front.host,
            port=config.front.port,
            loop="auto",
            http=guarded_protocol(config.front, max_connections),
            lifespan="on",
            log_config=None,
            access_log=False,
            timeout_keep_alive=config.front.keep_alive_timeout_s,  # type: ignore[arg-type]
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            log_level=config.front.uvicorn_log_level or None,
            **tls_options(config.front),
        ),
        app.state.front,
    )
    # uvicorn handles the signals while it runs and re-raises them after its shutdown; catching them here
    # turns that re-raise into a normal return (exit code 0) instead of a death by signal.
    sockets = None
    if config.front.processes > 1:
        sockets = [reuse_port_listener(config.front.host, config.front.port, server.config.backlog)]
    with stop_on_signals(lambda: setattr(server, "should_exit", True)):
        server.run(sockets=sockets)
