"""Security rules with real processes:

- the bus bound to a non-loopback tcp address without CURVE keys: `detok engine` and `detok serve` refuse to start
  (exit 1, the reason on stderr, no child started), unless bus.allow_insecure_tcp;
- `detok serve` on tcp + CURVE: the service works; a peer without the server's public key can neither join as a
  worker nor submit work, one with it can; the runtime dir is 0700 and the config holding the secret key 0600;
  the API key is enforced (401, /health stays open) and a body over front.max_request_bytes is a 413;
- a runtime dir other users can enter is refused (exit 1, clear message).

Also covered elsewhere: CURVE at socket level (unit/bus/test_sockets.py), the 0700 rules of the runtime dir
(unit/bus/test_endpoints.py, process/test_supervisor_lifecycle.py), API key and 413 on the in-process front
(faults/test_front_faults.py), sandboxed chat templates (unit/tokenizer/test_chat_template_source.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from helpers.front_harness import free_port
from helpers.serve_helpers import REPO, ServeProcess, serving, wait_for

from detok_worker.bus.codec import encode
from detok_worker.bus.messages import Heartbeat, Hello, RequestParams, Submit

API_KEY = "s3cret-key"
REFUSAL = "refusing to bind"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "detok_worker.cli", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def test_engine_and_serve_refuse_an_insecure_tcp_bus(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    endpoint = f"tcp://0.0.0.0:{free_port()}"
    engine = run_cli("engine", "--runtime-dir", str(runtime), "--set", f"bus.worker_endpoint={endpoint}")
    assert engine.returncode == 1
    assert REFUSAL in engine.stderr and "bus.allow_insecure_tcp" in engine.stderr

    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(xdg))
    serve = run_cli("serve", "--port", "0", "--set", f"bus.front_endpoint={endpoint}", env=env)
    assert serve.returncode == 1
    assert "startup failed" in serve.stderr and REFUSAL in serve.stderr
    assert "started engine" not in serve.stderr  # refused before any child was started
    assert list(xdg.iterdir()) == []

    # the operator's explicit opt-in for a trusted network: the engine binds and serves until SIGTERM
    insecure = [sys.executable, "-m", "detok_worker.cli", "engine", "--runtime-dir", str(runtime)]
    insecure += ["--set", f"bus.worker_endpoint={endpoint}", "--set", "bus.allow_insecure_tcp=true"]
    log_path = tmp_path / "engine.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(insecure, cwd=REPO, stderr=log_file)
    try:
        port = int(endpoint.rsplit(":", 1)[1])
        wait_for(lambda: _listening(port), 60, what="the engine to bind its tcp endpoint")
        # its loop runs (SIGTERM now stops it cleanly; before, the default action would end it)
        wait_for(lambda: "engine: submits at" in log_path.read_text(), 60, what="the engine loop")
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0, log_path.read_text()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def curve_service() -> Any:
    public, secret = (key.decode() for key in zmq.curve_keypair())
    ports = {name: free_port() for name in ("engine", "worker", "front")}
    with serving(
        "--workers", "1", "--source", "echo", "--step-interval-ms", "1",
        "--set", f"bus.engine_endpoint=tcp://0.0.0.0:{ports['engine']}",
        "--set", f"bus.worker_endpoint=tcp://0.0.0.0:{ports['worker']}",
        "--set", f"bus.front_endpoint=tcp://0.0.0.0:{ports['front']}",
        "--set", f"bus.curve_server_public_key={public}", "--set", f"bus.curve_server_secret_key={secret}",
        "--set", f"front.api_key={API_KEY}", "--set", "front.max_request_bytes=20000",
        "--set", "engine.stats_interval_s=0.1", "--set", "worker.stats_interval_s=0.1",
    ) as serve:  # fmt: skip
        yield serve, ports, public.encode()


def _authorized(serve: ServeProcess) -> httpx.Client:
    return httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)


def _engine_stats(serve: ServeProcess) -> dict[str, Any]:
    with _authorized(serve) as client:
        return client.get("/stats").json()


def _peer(
    context: zmq.Context[Any], kind: int, endpoint: str, server_key: bytes | None, routing_id: bytes = b""
) -> zmq.Socket[Any]:
    sock = context.socket(kind)
    if routing_id:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    if server_key is not None:
        public, secret = zmq.curve_keypair()
        sock.setsockopt(zmq.CURVE_SERVERKEY, server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _try_send(sock: zmq.Socket[Any], message: object) -> None:
    with contextlib.suppress(zmq.Again):  # a peer whose handshake failed has nobody to queue for
        sock.send(encode(message), zmq.NOBLOCK)


def test_curve_bus_serves_and_keeps_keyless_peers_out(curve_service: Any) -> None:
    serve, ports, server_key = curve_service
    with _authorized(serve) as client:
        response = client.post("/v1/completions", json={"prompt": "over CURVE", "max_tokens": 20})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "over CURVE"

    late_before = _engine_stats(serve)["front"].get("late_deltas", 0)
    context = zmq.Context()
    try:
        peers = {}
        for name, key in (("keyless", None), ("keyed", server_key)):
            dealer = _peer(context, zmq.DEALER, f"tcp://127.0.0.1:{ports['worker']}", key, f"rogue-{name}".encode())
            _try_send(dealer, Hello(f"rogue-{name}", 1))
            peers[name] = dealer
        keyless_push = _peer(context, zmq.PUSH, f"tcp://127.0.0.1:{ports['engine']}", None)
        _try_send(keyless_push, Submit("rogue-submit", [9707], RequestParams(max_tokens=4)))

        def keyed_joined() -> bool:
            for name, dealer in peers.items():
                _try_send(dealer, Heartbeat(f"rogue-{name}", 0))
            return "rogue-keyed" in _engine_stats(serve)["engine"]["workers"]

        wait_for(keyed_joined, 10, what="the peer holding the server key to join")  # the positive control
        time.sleep(1.0)  # the keyless ones have had as long, and more
        stats = _engine_stats(serve)
        assert "rogue-keyless" not in stats["engine"]["workers"]
        assert stats["front"].get("late_deltas", 0) == late_before  # the keyless Submit never generated anything
    finally:
        context.destroy(linger=0)


def test_runtime_dir_and_config_file_are_private(curve_service: Any) -> None:
    serve, _, _ = curve_service
    assert stat.S_IMODE(serve.runtime_dir.stat().st_mode) == 0o700
    config = serve.runtime_dir / "config.toml"
    assert "curve_server_secret_key" in config.read_text()
    assert stat.S_IMODE(config.stat().st_mode) == 0o600


def test_api_key_and_body_limit_on_the_real_front(curve_service: Any) -> None:
    serve, _, _ = curve_service
    body = {"prompt": "x", "max_tokens": 2}
    assert httpx.post(f"{serve.url}/v1/completions", json=body, timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    response = httpx.post(f"{serve.url}/v1/completions", json=body, headers=wrong, timeout=30)
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{serve.url}/stats", timeout=30).status_code == 401
    assert httpx.get(f"{serve.url}/health", timeout=30).status_code == 200
    with _authorized(serve) as client:
        response = client.post("/v1/completions", json={"prompt": "y" * 30_000, "max_tokens": 2})
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
        assert client.post("/v1/completions", json=body).status_code == 200


def test_a_runtime_dir_others_can_enter_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    result = run_cli("worker", "--runtime-dir", str(shared))
    assert result.returncode == 1
    assert "must be 700" in result.stderr and str(shared) in result.stderr
    assert list(shared.iterdir()) == []
