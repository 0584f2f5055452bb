"""Test harness for a real `detok serve` run: start it as a subprocess, find its URL and children, stop it.

Every wait has a deadline; on a failed start the supervisor's log is in the error message.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
URL_LINE = re.compile(r"serving at (https?://\S+)")
LOOPBACK_TLS = ssl.create_default_context()
LOOPBACK_TLS.check_hostname = False
LOOPBACK_TLS.verify_mode = ssl.CERT_NONE


def wait_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def children_of(pid: int) -> dict[int, str]:
    """Live child pids of `pid` -> their command line."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found[int(entry.name)] = process_cmdline(int(entry.name)) or ""
        except (OSError, IndexError, ValueError):
            continue
    return found


def process_cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None


async def sse_payloads(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of an SSE stream's lines (an httpx response's `aiter_lines()`), up to `[DONE]`."""
    async for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def named_sse_events(lines: list[str]) -> list[dict[str, Any]]:
    """The events of a stream of named events (Anthropic's, OpenAI's Responses): the non-empty lines alternate an
    `event: <type>` line and a `data:` line whose JSON has that type."""
    events = [json.loads(data.removeprefix("data: ")) for data in lines[1::2]]
    assert lines[::2] == [f"event: {event['type']}" for event in events], lines[:6]
    return events


def http_json(url: str, timeout: float = 5.0) -> tuple[int, Any]:
    """GET `url`: (status, JSON body). A `detok serve` over TLS is asked on the loopback without checking its
    certificate (a test's self-signed one)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=LOOPBACK_TLS) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


class ServeProcess:
    """`python -m detok_worker.cli serve --port 0 ...` with its own XDG_RUNTIME_DIR (so its runtime dir is findable)."""

    def __init__(
        self,
        *args: str,
        startup_timeout: float = 90.0,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> None:
        """`python`: the interpreter (another virtualenv's, e.g. vLLM's); `env`: variables added to the environment."""
        self.xdg_dir = Path(tempfile.mkdtemp(prefix="detok-test-xdg-"))
        self.log_path = self.xdg_dir.parent / f"{self.xdg_dir.name}.log"
        self.log_file = open(self.log_path, "w+b")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, **(env or {}), XDG_RUNTIME_DIR=str(self.xdg_dir), PYTHONUNBUFFERED="1")
        self.argv = [python, "-m", "detok_worker.cli", "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(
            self.argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=self.log_file, text=True
        )
        self.seen_children: dict[int, str] = {}
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self.url = self._wait_url(startup_timeout)
        self.runtime_dir = next(self.xdg_dir.glob("detok-serve-*"))

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _wait_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            match = URL_LINE.search(line)
            if match:
                return match.group(1)
        self.stop()
        log = self.log()
        self.cleanup()
        raise AssertionError(f"detok serve did not start (exit code {self.proc.returncode}); log:\n{log}")

    def log(self, tail: int | None = 6000) -> str:
        text = self.log_path.read_text(errors="replace")
        return text[-tail:] if tail else text

    def stats(self) -> dict[str, Any]:
        status, body = http_json(f"{self.url}/stats")
        assert status == 200, body
        return body

    def health(self) -> int:
        try:
            return http_json(f"{self.url}/health", timeout=2.0)[0]
        except (urllib.error.URLError, OSError):
            return 0

    def children(self) -> dict[int, str]:
        found = children_of(self.proc.pid)
        self.seen_children.update(found)
        return found

    def child_pids(self, role: str) -> list[int]:
        return [pid for pid, cmd in self.children().items() if f"detok_worker.cli {role}" in cmd]

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            self.log_file.close()
        return self.proc.returncode

    def cleanup(self) -> None:
        """Last resort for a failed test: kill whatever is left of this run, remove the temp dirs."""
        self.children()
        self.stop(signal.SIGKILL)
        for pid, cmdline in self.seen_children.items():
            if pid_alive(pid) and process_cmdline(pid) == cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.xdg_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.log_path.unlink()


@contextlib.contextmanager
def serving(
    *args: str, timeout: float = 30.0, ready: Callable[[ServeProcess], Any] | None = None, **options: Any
) -> Iterator[ServeProcess]:
    """The one way a test runs `detok serve`: started with `args` (`options`: ServeProcess's keywords), yielded once
    /health says 200 and `ready(process)` (if given) holds within `timeout` seconds; stopped and its files removed
    however the block ends. A service that does not get ready fails the test with its exit code and log tail."""
    process = ServeProcess(*args, **options)
    try:
        try:
            wait_for(
                lambda: process.health() == 200 and (ready is None or ready(process)), timeout, what="a ready service"
            )
        except AssertionError as exc:
            code = process.proc.poll()
            raise AssertionError(f"detok serve: {exc} (exit code {code}); log:\n{process.log()}") from None
        yield process
    finally:
        process.stop()
        process.cleanup()


def trace_service(trace: Path, *extra: str) -> contextlib.AbstractContextManager[ServeProcess]:
    """`serving` one worker on a recorded engine trace replayed without pauses: every request gets the recording's
    output; `extra` are more CLI flags."""
    return serving("--workers", "1", "--source", "trace", "--trace", str(trace), "--replay-speed", "0", *extra)
