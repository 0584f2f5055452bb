"""What a token source is: it plans a request's output ids (TokenSource, Plan), or generates them step by step
(GeneratingSource), or fails with SourceError."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from detok_worker.bus.messages import RequestParams
from detok_worker.errors import OperatorError


class SourceError(OperatorError, ValueError):
    """A token source cannot be built (empty corpus, unreadable files, empty trace)."""


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
