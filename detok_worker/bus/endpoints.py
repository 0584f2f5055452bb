"""Where the three bus sockets live.

An explicit `bus.*_endpoint` wins. An empty one becomes `ipc://{runtime_dir}/{engine,workers,front}.sock`, where
runtime_dir is `bus.runtime_dir` or the per-user default `${XDG_RUNTIME_DIR:-/tmp}/detok-{uid}`. The directory
is created with mode 0700 and refused if it exists with looser permissions or another owner: whoever can reach
the sockets can inject requests and read every reply.

With `front.processes` N > 1 front i (1 .. N-1) binds its own PULL at `front_endpoint(endpoints, i)`: the front
endpoint's ipc path with `-i` before `.sock` (`front-1.sock`), or its tcp port plus i.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from detok_worker.bus.errors import EndpointError, RuntimeDirError
from detok_worker.config import DetokConfig

TRANSPORTS = ("ipc://", "tcp://")
# sockaddr_un.sun_path is 108 bytes on Linux (104 on macOS) including the terminating NUL.
MAX_IPC_PATH_BYTES = 103


@dataclass(frozen=True, slots=True)
class Endpoints:
    engine: str  # front -> engine (Submit/Abort); the engine binds a PULL
    workers: str  # engine <-> workers; the engine binds a ROUTER, workers connect DEALERs
    front: str  # workers/engine -> front; the front binds a PULL
    runtime_dir: str | None  # directory holding the ipc sockets, None when every endpoint is explicit


def default_runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return Path(base) / f"detok-{os.getuid()}"


def ensure_private_dir(path: str | Path) -> Path:
    """Create `path` with mode 0700 (parents as needed) or check that the existing one is private and ours."""
    directory = Path(path)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RuntimeDirError(f"cannot create runtime directory {directory}: {exc}") from exc
    try:
        info = os.lstat(directory)
    except OSError as exc:
        raise RuntimeDirError(f"cannot stat runtime directory {directory}: {exc}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(f"runtime directory {directory} is not a directory (or is a symlink)")
    if info.st_uid != os.getuid():
        raise RuntimeDirError(f"runtime directory {directory} is owned by uid {info.st_uid}, not {os.getuid()}")
    if info.st_mode & 0o077:
        raise RuntimeDirError(
            f"runtime directory {directory} has mode {stat.S_IMODE(info.st_mode):o}; it must be 700 "
            "(other users could reach the bus sockets)"
        )
    return directory


def check_endpoint(endpoint: str) -> str:
    """Validate an endpoint string; returns it unchanged."""
    if not endpoint.startswith(TRANSPORTS):
        raise EndpointError(f"bus endpoint {endpoint!r} must start with one of {', '.join(TRANSPORTS)}")
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if not path:
            raise EndpointError(f"bus endpoint {endpoint!r} has no path")
        if len(os.fsencode(path)) > MAX_IPC_PATH_BYTES:
            raise EndpointError(
                f"ipc path {path!r} is longer than {MAX_IPC_PATH_BYTES} bytes (a Unix socket limit); "
                "use a shorter bus.runtime_dir"
            )
    else:
        tcp_host_port(endpoint)
    return endpoint


def tcp_host_port(endpoint: str) -> tuple[str, str]:
    """Split `tcp://host:port` (host may be `[v6]`, an interface name or `*`)."""
    rest = endpoint[len("tcp://") :]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port:
        raise EndpointError(f"tcp endpoint {endpoint!r} must look like tcp://host:port")
    # A connect endpoint may name a source address: tcp://src;host:port. Only the peer host matters here.
    host = host.rpartition(";")[2]
    return host.strip("[]"), port


def is_loopback_tcp(endpoint: str) -> bool:
    host, _ = tcp_host_port(endpoint)
    if host in ("localhost", "lo"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "*", an interface name or a host name: may be reachable from other hosts


def resolve_endpoints(config: DetokConfig) -> Endpoints:
    """The three endpoints for this config; creates the private runtime directory when an ipc default is used."""
    bus = config.bus
    explicit = {"engine": bus.engine_endpoint, "workers": bus.worker_endpoint, "front": bus.front_endpoint}
    runtime_dir: Path | None = None
    resolved: dict[str, str] = {}
    for name, endpoint in explicit.items():
        if not endpoint:
            if runtime_dir is None:
                runtime_dir = ensure_private_dir(bus.runtime_dir or default_runtime_dir())
            endpoint = f"ipc://{runtime_dir / f'{name}.sock'}"
        resolved[name] = check_endpoint(endpoint)
    return Endpoints(**resolved, runtime_dir=str(runtime_dir) if runtime_dir is not None else None)


def front_endpoint(endpoints: Endpoints, index: int) -> str:
    """The PULL endpoint of front process `index` (0 is `endpoints.front`)."""
    base = endpoints.front
    if index == 0:
        return base
    if base.startswith("ipc://"):
        stem, dot, suffix = base.rpartition(".")
        return f"{stem}-{index}.{suffix}" if dot and "/" not in suffix else f"{base}-{index}"
    host, port = tcp_host_port(base)
    if not port.isdigit():
        raise EndpointError(f"with front.processes > 1 the front endpoint {base!r} needs a numeric port")
    prefix = base[: len(base) - len(port)]
    return check_endpoint(f"{prefix}{int(port) + index}")


def front_endpoints(endpoints: Endpoints, count: int) -> list[str]:
    """Every front process's PULL endpoint, by index."""
    return [front_endpoint(endpoints, index) for index in range(count)]
