"""The front process: serves the app (app.py) with uvicorn (uvloop when installed) on config.front.host:port
until SIGINT/SIGTERM, then drains and exits cleanly.

The first SIGINT/SIGTERM starts a drain (Front.drain): the listener stays open so new requests get a 503 with
Retry-After and /health says "draining"; live requests may finish for up to front.drain_timeout_s, the rest end
with an error event; then uvicorn shuts down. A second signal exits at once. HTTP limits (head/body deadlines,
connection cap, open-file limit) and the draining server: edge.py.

With front.processes > 1 each front process binds its own listening socket on host:port with SO_REUSEPORT: Linux
hashes each new connection to one of the listening sockets, so the fronts share the load with no accept herd.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import uvicorn

from detok_worker.config import DetokConfig, FrontConfig
from detok_worker.front.app import create_app
from detok_worker.front.edge import DrainingServer, connection_cap, guarded_protocol, raise_fd_limit
from detok_worker.metrics import observe_tokenizer_load
from detok_worker.process.runtime import stop_on_signals
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer

GRACEFUL_SHUTDOWN_S = 1.0  # after the drain: connections get this long to close before their tasks are cancelled


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
        app.state.front.drain,
    )
    # uvicorn handles the signals while it runs and re-raises them after its shutdown; catching them here
    # turns that re-raise into a normal return (exit code 0) instead of a death by signal.
    sockets = None
    if config.front.processes > 1:
        sockets = [reuse_port_listener(config.front.host, config.front.port, server.config.backlog)]
    with stop_on_signals(lambda: setattr(server, "should_exit", True)):
        server.run(sockets=sockets)
