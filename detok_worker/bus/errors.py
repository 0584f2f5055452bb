"""Typed errors of the bus layer (endpoints, runtime directory, socket security)."""

from __future__ import annotations

from detok_worker.errors import OperatorError


class BusError(OperatorError):
    """Base class of every error the bus layer raises on purpose."""


class EndpointError(BusError):
    """An endpoint string is malformed or unusable (unknown transport, ipc path too long)."""


class RuntimeDirError(BusError):
    """The ipc runtime directory cannot be created or is not private (mode 0700, owned by us)."""


class InsecureEndpointError(BusError):
    """Binding a non-loopback tcp:// endpoint without CURVE keys (and without bus.allow_insecure_tcp)."""


class CurveKeyError(BusError):
    """CURVE keys in the config are malformed or do not belong together."""


class BindError(BusError):
    """A socket could not bind its endpoint (address in use, permission denied, ...)."""
