"""`detok front` as a real process: serves on its port with the embedded tokenizer, and on SIGTERM aborts its
live requests in the engine, removes its ipc socket and exits 0 promptly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fixtures import REPO
from helpers.front_harness import PlayedEngine, front_config

from detok_worker.bus.messages import Submit, TextDelta

openai = pytest.importorskip("openai")


def endless(submit: Submit) -> list[TextDelta]:
    return [TextDelta(submit.rid, 2 * i, "z ", i + 1) for i in range(100_000)]


def wait_healthy(url: str, process: subprocess.Popen[Any], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("the front did not become healthy")


def test_front_process_serves_and_stops_cleanly() -> None:
    with front_config() as config:
        runtime_dir = config.bus.runtime_dir
        port = config.front.port
        engine = PlayedEngine(config, plan=lambda submit: [])
        command = [sys.executable, "-m", "detok_worker", "front", "--runtime-dir", runtime_dir]
        command += ["--set", f"front.port={port}", "--set", "front.drain_timeout_s=1"]  # the live stream is endless
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with engine:
            process = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
            try:
                url = f"http://127.0.0.1:{port}"
                wait_healthy(url, process)
                with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30) as client:
                    engine.plan = lambda submit: [TextDelta(submit.rid, 0, "pong", 1, finish="stop")]
                    model = client.models.list().data[0].id
                    assert client.completions.create(model=model, prompt="ping").choices[0].text == "pong"

                    engine.plan = endless
                    with httpx.stream("POST", f"{url}/v1/completions", json={"prompt": "go", "stream": True}) as live:
                        lines = live.iter_lines()
                        assert any("z " in next(lines) for _ in range(4))
                        rid = [engine.submits.get(timeout=5) for _ in range(2)][-1].rid
                        started = time.monotonic()
                        process.send_signal(signal.SIGTERM)
                        assert process.wait(timeout=10) == 0
                        stopped_in = time.monotonic() - started
                aborted = set()
                while not engine.aborts.empty():
                    aborted.add(engine.aborts.get_nowait()[0].rid)
                if rid not in aborted:  # the Abort may still be in flight on the socket
                    aborted.add(engine.aborts.get(timeout=5)[0].rid)
                assert rid in aborted
                assert stopped_in < 5.0
                assert not (Path(runtime_dir) / "front.sock").exists()
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
