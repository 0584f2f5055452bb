"""Socket factories: the only place that creates bus sockets.

Every socket gets the configured high-water marks and a short linger. tcp:// endpoints use CURVE when keys are
configured (the binding side is the CURVE server, the connecting side a client with an ephemeral key pair);
binding a non-loopback tcp:// endpoint without keys is refused unless `bus.allow_insecure_tcp`. ipc:// endpoints
rely on the private runtime directory instead. Every socket refuses frames over `bus.max_message_bytes`
(ZMQ_MAXMSGSIZE): libzmq reads the size first and drops the sender's connection instead of the frame's memory
(a peer reconnects by itself; messages queued behind the big frame on that connection are lost with it).
`watch_drops` counts such dropped connections on the bound receiving sockets of a process.

Works with a plain `zmq.Context` and with `zmq.asyncio.Context` (the factories only set options, bind and connect).
"""

from __future__ import annotations

import binascii
import contextlib
import os
import struct
from typing import Any

import zmq
from zmq.utils import z85

from detok_worker.bus.codec import BAD_MULTIPART, FrameDecoder
from detok_worker.bus.endpoints import Endpoints, front_endpoint, front_endpoints, is_loopback_tcp, resolve_endpoints
from detok_worker.bus.errors import BindError, CurveKeyError, InsecureEndpointError
from detok_worker.config import BusConfig, DetokConfig

LINGER_MS = 200  # long enough for a last Goodbye/TextBatch to leave, short enough for a prompt exit


def _decode_z85_key(key: str, name: str) -> bytes | None:
    """bus.<name>, checked; None when it is not set."""
    if not key:
        return None
    if len(key) != 40:
        raise CurveKeyError(f"bus.{name} must be a 40-character Z85 CURVE key (got {len(key)} characters)")
    try:
        z85.decode(key.encode("ascii"))
    except (ValueError, binascii.Error, KeyError, struct.error) as exc:
        raise CurveKeyError(f"bus.{name} is not valid Z85: {exc}") from exc
    return key.encode("ascii")


class CurveKeys:
    """The server key pair from the config (the secret only where a process binds tcp)."""

    def __init__(self, bus: BusConfig) -> None:
        self.server_public = _decode_z85_key(bus.curve_server_public_key, "curve_server_public_key")
        self.server_secret = _decode_z85_key(bus.curve_server_secret_key, "curve_server_secret_key")
        if self.server_secret is not None:
            derived = zmq.curve_public(self.server_secret)
            if self.server_public is None:
                self.server_public = derived
            elif derived != self.server_public:
                raise CurveKeyError("bus.curve_server_public_key does not match bus.curve_server_secret_key")
        if (self.server_public is not None or self.server_secret is not None) and not zmq.has("curve"):
            raise CurveKeyError("CURVE keys are configured but this libzmq was built without CURVE support")

    @property
    def can_serve(self) -> bool:
        return self.server_secret is not None

    @property
    def can_connect(self) -> bool:
        return self.server_public is not None


class BusSockets:
    """Creates this process's bus sockets from the config and closes them all on `close()`."""

    def __init__(self, config: DetokConfig, context: zmq.Context[Any] | None = None) -> None:
        self.config = config
        self.endpoints: Endpoints = resolve_endpoints(config)
        self.curve = CurveKeys(config.bus)
        self._own_context = context is None
        self.context: zmq.Context[Any] = context if context is not None else zmq.Context()
        self._sockets: list[zmq.Socket[Any]] = []
        self._monitors: list[tuple[zmq.Socket[Any], zmq.Socket[Any]]] = []  # (socket, its monitor)
        self._bound_ipc_paths: list[str] = []

    # ---- the sockets each process needs ------------------------------------------------------------

    def engine_pull(self) -> zmq.Socket[Any]:
        """Engine: receives Submit/Abort from the front."""
        return self._bind(self._new(zmq.PULL), self.endpoints.engine)

    def worker_router(self) -> zmq.Socket[Any]:
        """Engine: talks to every worker; a restarted worker with the same id takes over its route."""
        sock = self._new(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        return self._bind(sock, self.endpoints.workers)

    def front_pull(self, index: int = 0) -> zmq.Socket[Any]:
        """Front `index` (or a collector): TextBatch/WorkerStats from workers, Reject/EngineStats from the engine."""
        return self._bind(self._new(zmq.PULL), front_endpoint(self.endpoints, index))

    def engine_push(self) -> zmq.Socket[Any]:
        """Front: sends Submit/Abort to the engine."""
        return self._connect(self._new(zmq.PUSH), self.endpoints.engine)

    def worker_dealer(self, worker_id: str) -> zmq.Socket[Any]:
        """Worker: talks to the engine with routing id = worker id."""
        sock = self._new(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, worker_id.encode("utf-8"))
        return self._connect(sock, self.endpoints.workers)

    def front_push(self) -> zmq.Socket[Any]:
        """Workers and the engine: send to the front."""
        return self._connect(self._new(zmq.PUSH), self.endpoints.front)

    def front_pushes(self) -> list[zmq.Socket[Any]]:
        """Workers and the engine: one PUSH per front process (front.processes), by front index."""
        endpoints = front_endpoints(self.endpoints, self.config.front.processes)
        return [self._connect(self._new(zmq.PUSH), endpoint) for endpoint in endpoints]

    def watch_drops(self, sock: zmq.Socket[Any]) -> None:
        """Count the connections `sock` loses from now on (`dropped_connections`): a frame over
        bus.max_message_bytes, or a peer that went away."""
        self._monitors.append((sock, sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)))

    def dropped_connections(self) -> int:
        """Connections lost by the watched sockets since the last call."""
        dropped = 0
        for _, monitor in self._monitors:
            while monitor.poll(0):
                monitor.recv_multipart()
                dropped += 1
        return dropped

    def close(self) -> None:
        for sock, monitor in self._monitors:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            monitor.close(linger=0)
        self._monitors.clear()
        for sock in self._sockets:
            sock.close(linger=LINGER_MS)
        self._sockets.clear()
        for path in self._bound_ipc_paths:  # libzmq leaves the socket file behind
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._bound_ipc_paths.clear()
        if self._own_context:
            self.context.term()

    def __enter__(self) -> BusSockets:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- helpers ------------------------------------------------------------------------------------

    def _new(self, socket_type: int) -> zmq.Socket[Any]:
        sock = self.context.socket(socket_type)
        hwm = self.config.bus.high_water_mark
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.bus.max_message_bytes)
        self._sockets.append(sock)
        return sock

    def _bind(self, sock: zmq.Socket[Any], endpoint: str) -> zmq.Socket[Any]:
        check_bind_allowed(endpoint, self.curve, self.config.bus)
        if endpoint.startswith("tcp://") and self.curve.can_serve:
            sock.setsockopt(zmq.CURVE_SERVER, 1)
            sock.setsockopt(zmq.CURVE_SECRETKEY, self.curve.server_secret)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            raise BindError(f"cannot bind {endpoint}: {exc}") from exc
        if endpoint.startswith("ipc://"):
            self._bound_ipc_paths.append(endpoint[len("ipc://") :])
        return sock

    def _connect(self, sock: zmq.Socket[Any], endpoint: str) -> zmq.Socket[Any]:
        if endpoint.startswith("tcp://") and self.curve.can_connect:
            public, secret = zmq.curve_keypair()
            sock.setsockopt(zmq.CURVE_SERVERKEY, self.curve.server_public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.connect(endpoint)
        return sock


def check_bind_allowed(endpoint: str, curve: CurveKeys, bus: BusConfig) -> None:
    """Binding a non-loopback tcp endpoint needs the CURVE secret key, unless bus.allow_insecure_tcp."""
    insecure = endpoint.startswith("tcp://") and not curve.can_serve and not bus.allow_insecure_tcp
    if insecure and not is_loopback_tcp(endpoint):
        raise InsecureEndpointError(
            f"refusing to bind {endpoint} without CURVE keys: set bus.curve_server_public_key and "
            "bus.curve_server_secret_key (a pair from zmq.curve_keypair()), or bus.allow_insecure_tcp = true "
            "on a trusted network"
        )


def check_binds_allowed(config: DetokConfig) -> Endpoints:
    """For a launcher that starts every binding process (`detok serve`): fail before starting any of them."""
    endpoints = resolve_endpoints(config)
    curve = CurveKeys(config.bus)
    fronts = front_endpoints(endpoints, config.front.processes)
    for endpoint in (endpoints.engine, endpoints.workers, *fronts):
        check_bind_allowed(endpoint, curve, config.bus)
    return endpoints


def recv_single_frame(sock: zmq.Socket[Any], decoder: FrameDecoder[Any]) -> bytes | None:
    """Receive one message without blocking (zmq.Again when none is waiting). Bus messages are single-frame: a
    multi-part message is drained, counted as bad on `decoder` and returned as None."""
    frame = sock.recv(zmq.NOBLOCK)
    if not sock.getsockopt(zmq.RCVMORE):
        return frame
    while sock.getsockopt(zmq.RCVMORE):
        sock.recv()
    decoder.count_bad(BAD_MULTIPART)
    return None
