"""The Procfile under honcho: separate engine/front/worker processes meet in the per-user runtime dir,
`-c worker=3` scales the workers, a request succeeds, SIGTERM stops everything."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers.serve_helpers import REPO, http_json, pid_alive, wait_for

HONCHO = shutil.which("honcho")
pytestmark = [
    pytest.mark.skipif(HONCHO is None, reason="honcho is not installed (pip install -e '.[test]')"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inspects /proc"),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def session_members(session_id: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session_id and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_procfile_with_three_workers(tmp_path: Path) -> None:
    port = free_port()
    # `python` in the Procfile must be this interpreter; the runtime dir default lives under XDG_RUNTIME_DIR.
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    log_path = tmp_path / "honcho.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [HONCHO, "start", "-f", str(REPO / "Procfile"), "-d", str(REPO), "-p", str(port), "-c", "worker=3"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                return http_json(f"{url}/health", timeout=2)[0] == 200
            except OSError:
                return False

        wait_for(healthy, 90, interval=0.2, what=f"the Procfile's front at {url} (log: {log_path})")
        wait_for(lambda: len(http_json(f"{url}/stats")[1]["workers"]) == 3, 20, what="3 workers in /stats")
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        response = httpx.post(
            f"{url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 8}, timeout=30
        )
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"]
        assert (tmp_path / f"detok-{os.getuid()}").is_dir()
        members = session_members(proc.pid)
        assert len(members) >= 6  # honcho + front + engine + 3 workers (shells may sit in between)

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        for pid in members:
            wait_for(lambda pid=pid: not pid_alive(pid), 10, what=f"process {pid} to exit")
    finally:
        if proc.poll() is None or session_members(proc.pid):
            for pid in session_members(proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=10)
