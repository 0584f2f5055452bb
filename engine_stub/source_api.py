"""What a token source is: it plans a request's output ids (Plan), or fails with SourceError."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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
