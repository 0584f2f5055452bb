"""Endpoint resolution and the private runtime directory."""

from __future__ import annotations

import os
import stat

import pytest

from detok_worker.bus.endpoints import (
    MAX_IPC_PATH_BYTES,
    check_endpoint,
    default_runtime_dir,
    ensure_private_dir,
    front_endpoints,
    is_loopback_tcp,
    resolve_endpoints,
)
from detok_worker.bus.errors import EndpointError, RuntimeDirError
from detok_worker.config import load_config


def _config(**overrides: object):
    return load_config(None, {f"bus.{key}": value for key, value in overrides.items()})


def test_defaults_are_ipc_sockets_in_a_new_private_dir(tmp_path):
    runtime = tmp_path / "run" / "detok"
    endpoints = resolve_endpoints(_config(runtime_dir=str(runtime)))
    assert endpoints.engine == f"ipc://{runtime}/engine.sock"
    assert endpoints.workers == f"ipc://{runtime}/workers.sock"
    assert endpoints.front == f"ipc://{runtime}/front.sock"
    assert endpoints.runtime_dir == str(runtime)
    assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o700


def test_explicit_endpoints_win_and_need_no_runtime_dir(tmp_path):
    config = _config(
        runtime_dir=str(tmp_path / "never-created"),
        engine_endpoint="tcp://127.0.0.1:5551",
        worker_endpoint="tcp://127.0.0.1:5552",
        front_endpoint="ipc:///tmp/x-front.sock",
    )
    endpoints = resolve_endpoints(config)
    assert (endpoints.engine, endpoints.workers, endpoints.front) == (
        "tcp://127.0.0.1:5551",
        "tcp://127.0.0.1:5552",
        "ipc:///tmp/x-front.sock",
    )
    assert endpoints.runtime_dir is None
    assert not (tmp_path / "never-created").exists()


def test_each_front_process_has_its_own_endpoint(tmp_path):
    runtime = tmp_path / "rt"
    endpoints = resolve_endpoints(_config(runtime_dir=str(runtime)))
    assert front_endpoints(endpoints, 3) == [
        f"ipc://{runtime}/front.sock",
        f"ipc://{runtime}/front-1.sock",
        f"ipc://{runtime}/front-2.sock",
    ]
    tcp = resolve_endpoints(_config(runtime_dir=str(runtime), front_endpoint="tcp://127.0.0.1:7000"))
    assert front_endpoints(tcp, 2) == ["tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"]
    assert front_endpoints(tcp, 1) == ["tcp://127.0.0.1:7000"]
    wildcard = resolve_endpoints(_config(runtime_dir=str(runtime), front_endpoint="tcp://127.0.0.1:*"))
    with pytest.raises(EndpointError, match="numeric port"):
        front_endpoints(wildcard, 2)


def test_mixed_explicit_and_default(tmp_path):
    endpoints = resolve_endpoints(_config(runtime_dir=str(tmp_path / "rt"), worker_endpoint="tcp://127.0.0.1:7000"))
    assert endpoints.workers == "tcp://127.0.0.1:7000"
    assert endpoints.engine == f"ipc://{tmp_path / 'rt'}/engine.sock"


def test_default_dir_is_per_user_under_xdg_runtime_dir(tmp_path, monkeypatch):
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert default_runtime_dir() == xdg / f"detok-{os.getuid()}"
    endpoints = resolve_endpoints(_config())
    assert endpoints.runtime_dir == str(xdg / f"detok-{os.getuid()}")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert str(default_runtime_dir()) == f"/tmp/detok-{os.getuid()}"


def test_existing_private_dir_is_reused(tmp_path):
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    assert ensure_private_dir(runtime) == runtime


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_loose_permissions_are_refused(tmp_path, mode):
    runtime = tmp_path / "rt"
    runtime.mkdir()
    runtime.chmod(mode)
    with pytest.raises(RuntimeDirError, match="mode"):
        resolve_endpoints(_config(runtime_dir=str(runtime)))


def test_symlink_and_file_are_refused(tmp_path):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(RuntimeDirError):
        ensure_private_dir(link)
    plain_file = tmp_path / "file"
    plain_file.write_text("x")
    with pytest.raises(RuntimeDirError):
        ensure_private_dir(plain_file)


def test_uncreatable_dir_is_a_typed_error(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(RuntimeDirError):
        ensure_private_dir(blocker / "sub")


def test_endpoint_checks():
    with pytest.raises(EndpointError):
        check_endpoint("udp://127.0.0.1:5")
    with pytest.raises(EndpointError):
        check_endpoint("ipc://")
    with pytest.raises(EndpointError):
        check_endpoint("tcp://127.0.0.1")
    with pytest.raises(EndpointError, match="longer"):
        check_endpoint("ipc:///" + "a" * MAX_IPC_PATH_BYTES)
    assert check_endpoint("ipc:///" + "a" * (MAX_IPC_PATH_BYTES - 1)).endswith("a")


def test_too_long_runtime_dir_is_refused(tmp_path):
    deep = tmp_path / ("d" * 90)
    with pytest.raises(EndpointError):
        resolve_endpoints(_config(runtime_dir=str(deep)))


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.8.9.1:5555", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("tcp://lo:5555", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://10.0.0.7:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://[::]:5555", False),
        ("tcp://gpu-node-3.internal:5555", False),
    ],
)
def test_loopback_detection(endpoint, loopback):
    assert is_loopback_tcp(endpoint) is loopback
