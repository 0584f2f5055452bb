"""What an engine source is. Every source is the engine loop of docs/protocol.md section 5: an `EngineLink` fed
with token ids until SIGINT/SIGTERM. To the engine process a source is one function, `EngineRun`: it builds its
link from the config, serves, and returns the exit code (factory.py picks it by engine.source).

The local sources (corpus, echo, trace, llama-cpp) share one loop (local.py) and differ in how they give a
request's ids: a `TokenSource` plans them all at Submit (a `Plan`), a `GeneratingSource` generates them step by
step (a real model). A source that cannot be built raises `SourceError`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from detok_worker.bus.messages import RequestParams
from detok_worker.config import DetokConfig
from detok_worker.errors import OperatorError


class SourceError(OperatorError, ValueError):
    """A token source cannot be built (empty corpus, unreadable files, empty trace)."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    """The engine command's options beyond the config. replay: a trace file whose own requests the engine
    generates at their recorded times (local sources only); exit_after_replay: end once they all ended."""

    replay: str | None = None
    exit_after_replay: bool = False


# An engine source's loop: serves the bus until SIGINT/SIGTERM (or its own end), returns the exit code.
EngineRun = Callable[[DetokConfig, RunOptions], int]


@dataclass(frozen=True, slots=True)
class Plan:
    """What a request will generate: its output ids (before max_tokens truncation) and, for paced sources, the
    time after the request's arrival at which each id may be emitted (None: one step per tokens_per_step)."""

    ids: list[int]
    offsets_ns: list[int] | None = None


class TokenSource(Protocol):
    name: str

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan: ...


@runtime_checkable
class GeneratingSource(Protocol):
    """A source that makes ids step by step (a real model): `generate` as GeneratorEngine takes it (a ValueError
    from it refuses the request); eos_ids: its own end-of-generation ids (stops unless ignore_eos);
    max_running: how many requests it generates at once."""

    name: str
    eos_ids: frozenset[int]
    max_running: int

    def generate(
        self, prompt_ids: Sequence[int], max_tokens: int, stop_ids: Sequence[int], min_tokens: int
    ) -> Iterator[int | None]: ...
