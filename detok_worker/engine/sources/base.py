"""What an engine source is. Every source is the engine loop of docs/protocol.md section 5: an `EngineLink` fed
with token ids until SIGINT/SIGTERM. To the engine process a source is one function, `EngineRun`: it builds its
link from the config, serves, and returns the exit code (factory.py picks it by engine.source). A source that
cannot be built raises `SourceError`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from detok_worker.config import DetokConfig
from detok_worker.errors import OperatorError


class SourceError(OperatorError, ValueError):
    """A token source cannot be built (empty corpus, unreadable files, empty trace, no model)."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """The engine command's options beyond the config. replay: a trace file whose own requests the engine
    generates at their recorded times (the stub's sources only); exit_after_replay: end once they all ended."""

    replay: str | None = None
    exit_after_replay: bool = False


# An engine source's loop: serves the bus until SIGINT/SIGTERM (or its own end), returns the exit code.
EngineRun = Callable[[DetokConfig, RunOptions], int]
