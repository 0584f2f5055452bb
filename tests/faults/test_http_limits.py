"""HTTP limits of the real front:

- slowloris: connections that trickle header lines are closed after front.header_timeout_s, and while they are
  open a legitimate request succeeds, even past the open-file limit the front was started with (it raises its
  soft RLIMIT_NOFILE to the hard limit); 300 connections by default, 1,100 under -m slow;
- the connection cap: past front.max_connections a connection gets a 503 (Retry-After) and is closed at once;
- a body that does not arrive within front.body_timeout_s: the connection is closed, no traceback;
- the API key from DETOK_API_KEY or from a 0600 front.api_key_file; `--set front.api_key=...` warns.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.bus_peers import short_runtime_dir
from helpers.front_harness import free_port
from helpers.role_process import RoleProcess
from helpers.serve_helpers import REPO, wait_for
from helpers.slowloris import Slowloris

STARTED_SOFT_NOFILE = 256


@pytest.fixture
def runtime_dir() -> Iterator[str]:
    with short_runtime_dir("dth-") as path:
        yield path


def status(url: str, path: str = "/health", **kwargs: Any) -> int:
    try:
        return httpx.get(f"{url}{path}", timeout=2, **kwargs).status_code
    except httpx.HTTPError:
        return 0


def soft_and_hard_nofile(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open-file limit in /proc/PID/limits")


def slowloris_against_a_live_service(runtime_dir: str, connections: int) -> None:
    port = free_port()
    front = RoleProcess(
        runtime_dir, "front", "--set", f"front.port={port}", "--set", "front.header_timeout_s=5",
        soft_nofile=STARTED_SOFT_NOFILE,
    )  # fmt: skip
    others = [
        RoleProcess(runtime_dir, "engine", "--source", "echo", "--step-interval-ms", "2"),
        RoleProcess(runtime_dir, "worker", "--id", "w0"),
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: status(url) == 200, 60, what="the service healthy")
        soft, hard = soft_and_hard_nofile(front.proc.pid)
        assert soft == hard and int(soft) > connections > STARTED_SOFT_NOFILE
        attack = Slowloris(port, connections, trickle_s=0.5, give_up_s=60)
        attack.start()
        assert attack.all_open.wait(60)
        assert attack.result.opened == connections  # all open at once: more than the front's original fd limit
        body = {"prompt": "still serving everyone else", "max_tokens": 20}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200 and response.json()["choices"][0]["text"] == body["prompt"]
        attack.join(90)
        # every trickling connection was closed by the front (head timeout), silently, long before the clients
        # would have given up
        assert attack.result.closed_by_server == connections
        assert set(attack.result.answers) == {b""}
        assert status(url) == 200
    finally:
        for process in [front, *others]:
            process.stop()
    assert "Traceback" not in front.log()


def test_slowloris_does_not_stop_legitimate_requests(runtime_dir: str) -> None:
    slowloris_against_a_live_service(runtime_dir, 300)


@pytest.mark.slow
def test_1100_slowloris_connections(runtime_dir: str) -> None:
    slowloris_against_a_live_service(runtime_dir, 1100)


def test_connection_cap_and_body_timeout(runtime_dir: str) -> None:
    port = free_port()
    limits = [
        "--set",
        "front.max_connections=20",
        "--set",
        "front.header_timeout_s=60",
        "--set",
        "front.body_timeout_s=1",
    ]
    front = RoleProcess(runtime_dir, "front", "--set", f"front.port={port}", *limits)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: status(url, "/v1/models") == 200, 60, what="the front serving")
        idle = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(30)]
        answers = read_until_closed(idle)
        refused = [answer for answer in answers if answer is not None]
        assert len(refused) == 10  # 20 kept (they wait for a head), 10 refused
        for answer in refused:
            head = answer.split(b"\r\n\r\n")[0].lower()
            assert head.startswith(b"http/1.1 503") and b"retry-after: 1" in head and b"connection: close" in head
            assert b"too_many_connections" in answer
        for sock in idle:
            sock.close()
        wait_for(lambda: status(url, "/v1/models") == 200, 10, what="a request served once the others left")

        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow_body:
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
            slow_body.sendall(head + b'{"prompt": ')
            assert slow_body.recv(4096) == b""  # closed by the front after body_timeout_s, no answer owed
        assert status(url, "/v1/models") == 200
    finally:
        front.stop()
    assert "Traceback" not in front.log()


def read_until_closed(socks: list[socket.socket], quiet_s: float = 1.0) -> list[bytes | None]:
    """What the server sent on each socket before closing it; None for one it kept open with no data for `quiet_s`
    (all sockets are watched at once: one quiet window, not one per socket)."""
    data = {sock: b"" for sock in socks}
    closed: set[socket.socket] = set()
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while len(closed) < len(socks) and (ready := selector.select(timeout=quiet_s)):
            for key, _ in ready:
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                chunk = sock.recv(4096)
                data[sock] += chunk
                if not chunk:
                    closed.add(sock)
                    selector.unregister(sock)
    return [data[sock] if sock in closed else None for sock in socks]


def test_api_key_from_the_environment_or_a_private_file(runtime_dir: str, tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("from-a-file\n")
    key_file.chmod(0o600)
    check_key(runtime_dir, "from-env", env={"DETOK_API_KEY": "from-env"})
    check_key(runtime_dir, "from-a-file", "--set", f"front.api_key_file={key_file}")

    key_file.chmod(0o644)
    unsafe = run_cli(
        "front", "--runtime-dir", runtime_dir, "--port", str(free_port()), "--set", f"front.api_key_file={key_file}"
    )
    assert unsafe.returncode == 1 and "chmod 600" in unsafe.stderr
    both = run_cli("serve", "--port", "0", "--set", f"front.api_key_file={key_file}", env={"DETOK_API_KEY": "x"})
    assert both.returncode == 1 and "more than one place" in both.stderr
    shown = run_cli("config", "--set", "front.api_key=on-the-command-line")
    assert shown.returncode == 0 and "/proc/PID/cmdline" in shown.stderr and "DETOK_API_KEY" in shown.stderr


def check_key(runtime_dir: str, key: str, *args: str, env: dict[str, str] | None = None) -> None:
    port = free_port()
    front = RoleProcess(runtime_dir, "front", "--port", str(port), *args, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: status(url) != 0, 60, what="the front answering")
        assert status(url, "/v1/models") == 401
        assert status(url, "/v1/models", headers={"Authorization": f"Bearer {key}"}) == 200
        assert key not in Path(f"/proc/{front.proc.pid}/cmdline").read_text()
    finally:
        front.stop()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "detok_worker.cli", *args]
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, env=full_env)
