"""Socket factories over real ZMQ sockets: options, the tcp security rule, CURVE, ROUTER semantics."""

from __future__ import annotations

import pytest
import zmq
from helpers.bus_rows import text_batch

from detok_worker.bus.codec import encode, front_decoder
from detok_worker.bus.errors import BindError, CurveKeyError, InsecureEndpointError
from detok_worker.bus.messages import TextDelta
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import load_config

RECV_TIMEOUT_MS = 5000


def _config(tmp_path, **bus: object):
    overrides = {"bus.runtime_dir": str(tmp_path / "rt"), "bus.high_water_mark": 77}
    overrides.update({f"bus.{key}": value for key, value in bus.items()})
    return load_config(None, overrides)


def _recv(sock: zmq.Socket, timeout_ms: int = RECV_TIMEOUT_MS) -> bytes | None:
    return sock.recv() if sock.poll(timeout_ms) else None


def last_endpoint(sock: zmq.Socket) -> str:
    """The endpoint a socket actually bound (resolves `tcp://127.0.0.1:*` to the chosen port)."""
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def test_ipc_round_trip_with_hwm_and_linger(tmp_path):
    config = _config(tmp_path)
    with BusSockets(config) as server, BusSockets(config) as client:
        pull = server.front_pull()
        push = client.front_push()
        assert pull.getsockopt(zmq.RCVHWM) == 77
        assert push.getsockopt(zmq.SNDHWM) == 77
        assert 0 <= push.getsockopt(zmq.LINGER) <= 1000
        batch = text_batch("w1", 5, 3, [TextDelta("cmpl-1", 0, "héllo 👋", 2)])
        push.send(encode(batch))
        frame = _recv(pull)
        assert frame is not None
        assert front_decoder().decode(frame) == batch


def test_router_dealer_identity_mandatory_and_handover(tmp_path):
    config = _config(tmp_path)
    with BusSockets(config) as engine, BusSockets(config) as w_a, BusSockets(config) as w_b:
        router = engine.worker_router()
        dealer_a = w_a.worker_dealer("worker-7")
        dealer_a.send(b"hello from a")
        assert router.poll(RECV_TIMEOUT_MS)
        identity, payload = router.recv_multipart()
        assert (identity, payload) == (b"worker-7", b"hello from a")
        # ROUTER_MANDATORY: a message to an unknown worker is an error, not a silent drop.
        with pytest.raises(zmq.ZMQError) as excinfo:
            router.send_multipart([b"no-such-worker", b"x"])
        assert excinfo.value.errno == zmq.EHOSTUNREACH
        # ROUTER_HANDOVER: a new connection with the same id takes the route over.
        dealer_b = w_b.worker_dealer("worker-7")
        dealer_b.send(b"hello from b")
        assert router.poll(RECV_TIMEOUT_MS)
        assert router.recv_multipart() == [b"worker-7", b"hello from b"]
        router.send_multipart([b"worker-7", b"to the new one"])
        assert _recv(dealer_b) == b"to the new one"


def test_non_loopback_tcp_bind_needs_keys(tmp_path):
    config = _config(tmp_path, front_endpoint="tcp://0.0.0.0:*")
    with BusSockets(config) as sockets, pytest.raises(InsecureEndpointError):
        sockets.front_pull()


def test_loopback_tcp_binds_without_keys_and_insecure_flag_allows_any(tmp_path):
    with BusSockets(_config(tmp_path, front_endpoint="tcp://127.0.0.1:*")) as sockets:
        assert last_endpoint(sockets.front_pull()).startswith("tcp://127.0.0.1:")
    with BusSockets(_config(tmp_path, front_endpoint="tcp://0.0.0.0:*", allow_insecure_tcp=True)) as sockets:
        assert last_endpoint(sockets.front_pull()).startswith("tcp://0.0.0.0:")


def test_curve_keys_are_validated(tmp_path):
    public, secret = zmq.curve_keypair()
    other_public, _ = zmq.curve_keypair()
    with pytest.raises(CurveKeyError):
        BusSockets(_config(tmp_path, curve_server_public_key="short"))
    with pytest.raises(CurveKeyError):
        BusSockets(_config(tmp_path, curve_server_secret_key="~" * 40))
    with pytest.raises(CurveKeyError, match="does not match"):
        BusSockets(
            _config(tmp_path, curve_server_public_key=other_public.decode(), curve_server_secret_key=secret.decode())
        )
    # the public key may be left out where the secret is known: it is derived
    BusSockets(_config(tmp_path, curve_server_secret_key=secret.decode())).close()


def test_curve_secures_tcp_and_rejects_peers_without_the_server_key(tmp_path):
    public, secret = zmq.curve_keypair()
    server_config = _config(
        tmp_path,
        engine_endpoint="tcp://0.0.0.0:*",
        curve_server_public_key=public.decode(),
        curve_server_secret_key=secret.decode(),
    )
    with BusSockets(server_config) as server:
        pull = server.engine_pull()  # non-loopback bind is allowed: keys are set
        assert pull.getsockopt(zmq.CURVE_SERVER) == 1
        port = last_endpoint(pull).rsplit(":", 1)[1]
        endpoint = f"tcp://127.0.0.1:{port}"

        plain = _config(tmp_path, engine_endpoint=endpoint)
        wrong_key = _config(tmp_path, engine_endpoint=endpoint, curve_server_public_key=zmq.curve_keypair()[0].decode())
        keyed = _config(tmp_path, engine_endpoint=endpoint, curve_server_public_key=public.decode())
        with BusSockets(plain) as c_plain, BusSockets(wrong_key) as c_wrong, BusSockets(keyed) as c_keyed:
            c_plain.engine_push().send(b"plain")
            c_wrong.engine_push().send(b"wrong key")
            c_keyed.engine_push().send(b"keyed")
            assert _recv(pull) == b"keyed"
            assert _recv(pull, 300) is None


def test_bind_conflict_is_a_typed_error(tmp_path):
    with BusSockets(_config(tmp_path, front_endpoint="tcp://127.0.0.1:*")) as first:
        endpoint = last_endpoint(first.front_pull())
        with BusSockets(_config(tmp_path, front_endpoint=endpoint)) as second, pytest.raises(BindError):
            second.front_pull()


def test_ipc_socket_file_is_removed_on_close(tmp_path):
    config = _config(tmp_path)
    sockets = BusSockets(config)
    sockets.engine_pull()
    sock_file = tmp_path / "rt" / "engine.sock"
    assert sock_file.exists()
    sockets.close()
    assert not sock_file.exists()
