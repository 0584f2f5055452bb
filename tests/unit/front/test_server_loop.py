"""The front's uvicorn server loop: it waits for an exit request instead of looking for one ten times a second, so
an exit request must wake it at once, from any thread (signal handlers, the drain, a test harness)."""

from __future__ import annotations

import threading
import time

import httpx
import uvicorn
from helpers.front_harness import front_config

from detok_worker.front import edge
from detok_worker.front.app import create_app


def test_an_exit_request_from_another_thread_stops_the_server_before_its_next_tick(monkeypatch, qwen3):
    monkeypatch.setattr(edge, "TICK_S", 60.0)  # a loop that only looked once per tick would run for a minute
    with front_config() as config:
        app = create_app(config, qwen3)
        uvicorn_config = uvicorn.Config(
            app, host="127.0.0.1", port=config.front.port, lifespan="on", log_config=None, access_log=False
        )
        front_server = edge.DrainingServer(uvicorn_config, app.state.front.drain)
        thread = threading.Thread(target=front_server.run, name="test-front", daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while not front_server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert front_server.started
        response = httpx.get(f"http://127.0.0.1:{config.front.port}/health", timeout=5)
        assert "date" in response.headers  # the per-second work (the Date header) ran at the first tick

        front_server.should_exit = True
        thread.join(timeout=10)
        assert not thread.is_alive(), "the server loop did not wake for the exit request"
