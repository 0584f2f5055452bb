"""The front process: serves the app (app.py) with uvicorn (uvloop when installed) on config.front.host:port
until SIGINT/SIGTERM, then exits cleanly."""

from __future__ import annotations

import time

import uvicorn

from detok_worker.config import DetokConfig
from detok_worker.front.app import create_app
from detok_worker.metrics import observe_tokenizer_load
from detok_worker.process.signals import stop_on_signals
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer

GRACEFUL_SHUTDOWN_S = 1.0  # open streams get this long to finish before they are cut (all children exit < 5 s)


def run_front(config: DetokConfig, tokenizer: Tokenizer | None = None) -> None:
    """Serve the front on config.front.host:port; blocks until SIGINT/SIGTERM."""
    if tokenizer is None:
        start = time.perf_counter()
        tokenizer = load_configured_tokenizer(config)
        observe_tokenizer_load(tokenizer, time.perf_counter() - start, "front")
    app = create_app(config, tokenizer)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.front.host,
            port=config.front.port,
            loop="auto",
            lifespan="on",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    # uvicorn handles the signals while it runs and re-raises them after its shutdown; catching them here
    # turns that re-raise into a normal return (exit code 0) instead of a death by signal.
    with stop_on_signals(lambda: setattr(server, "should_exit", True)):
        server.run()
