"""Hosts made of Linux network namespaces, for multi-host tests on one machine (needs root: `ip netns`).

A "switch" namespace holds a bridge; every host is a namespace with one veth (`eth0`) plugged into it and an
address 10.77.0.N/24. Nothing is added to the machine's own network namespace, and every namespace name carries
this process's pid and a random suffix, so concurrent runs do not meet. Processes run inside a host with
`ip netns exec`; the test's own client code runs inside one on a thread that entered it with setns(2) (sockets
belong to the namespace they were created in). `close()` kills the processes and deletes every namespace (their
veths go with them), however the test ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import secrets
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from helpers.role_process import RoleProcess

SUBNET = "10.77.0"
CLONE_NEWNET = 0x40000000
Result = TypeVar("Result")


class NetnsUnavailable(RuntimeError):
    """`ip netns` cannot be used here (not root, no iproute2, a kernel without namespaces...)."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed (exit {result.returncode}): {result.stderr.strip()}")


class NetnsHosts:
    """Named hosts on one bridge; `address(host)` is its IPv4 address."""

    def __init__(self, hosts: Sequence[str]) -> None:
        if shutil.which("ip") is None:
            raise NetnsUnavailable("the `ip` command (iproute2) is not installed")
        prefix = f"detok-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch = f"{prefix}-switch"
        self.namespaces = {host: f"{prefix}-{host}" for host in hosts}
        self.addresses = {host: f"{SUBNET}.{index}" for index, host in enumerate(hosts, 1)}
        self.processes: list[RoleProcess] = []
        self._created: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for index, (host, namespace) in enumerate(self.namespaces.items()):
            self._add_namespace(namespace)
            port = f"port{index}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", namespace, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
            _ip("-n", namespace, "link", "set", "eth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")

    def _add_namespace(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self._created.append(namespace)

    def address(self, host: str) -> str:
        return self.addresses[host]

    def start(self, host: str, log_dir: str, role: str, *args: str, log_name: str) -> RoleProcess:
        """`detok ROLE ...` inside `host` (dies with this process: DETOK_PARENT_PID)."""
        process = RoleProcess(
            log_dir,
            role,
            *args,
            log_name=log_name,
            env={"DETOK_PARENT_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"},
            launcher=("ip", "netns", "exec", self.namespaces[host]),
        )
        self.processes.append(process)
        return process

    def cut(self, host: str) -> None:
        """Pull the host's cable: its only link goes down."""
        _ip("-n", self.namespaces[host], "link", "set", "dev", "eth0", "down")

    def call_in(self, host: str, function: Callable[..., Result], *args: Any) -> Result:
        """Run `function(*args)` on a thread inside `host`'s network namespace; its result or its exception."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                enter_namespace(self.namespaces[host])
                outcome["value"] = function(*args)
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc

        thread = threading.Thread(target=run, name=f"netns-{host}")
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def close(self) -> None:
        for process in self.processes:  # all at once: one cut off from its peers may take its time to exit
            with contextlib.suppress(ProcessLookupError):
                process.proc.terminate()
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.stop(timeout=3)
        for namespace in reversed(self._created):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        self._created.clear()


def enter_namespace(namespace: str) -> None:
    """Move the calling thread into a named network namespace (only this thread: setns acts per thread)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = os.open(Path("/run/netns") / namespace, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise NetnsUnavailable(f"setns into {namespace} failed: {os.strerror(errno)}")
    finally:
        os.close(fd)
