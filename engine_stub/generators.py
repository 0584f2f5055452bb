"""A step-wise engine made of per-request token generators, for the EngineLink loop (docs/protocol.md, section 5):
what the local loop (`run_local`) and the gRPC engine server run a generating source (llama-cpp) with.

Any `generate(prompt_ids, max_tokens, stop_ids, min_tokens) -> Iterator[int | None]` plugs in: a model run greedily
on CPU, a test's echo. Each step takes the next tokens_per_step ids of every running request; a request ends
"stop" at a stop id (or when its generator ends on its own) and "length" at max_tokens. A stop id among the first
min_tokens ids does not end it (a model's generator should not produce one there at all: it takes the next-best
id). A generator may yield None for a step that made no id yet (a chunk of the prompt's prefill), so one long
prompt does not hold the engine loop. At most max_running requests generate at once; the others wait in arrival
order. A generator that raises ends its request with "error" (`errors[rid]` says why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from detok_worker.bus.messages import FINISH_ERROR, FINISH_LENGTH, FINISH_STOP

log = logging.getLogger(__name__)

T = TypeVar("T")


class Admission(Generic[T]):
    """The stub engines' capped batch (`PlannedEngine`, `GeneratorEngine`), as an engine's continuous batching admits
    requests: by rid, `running` (at most `cap`; None: no cap) and `waiting` (arrival order)."""

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        self.running: dict[str, T] = {}
        self.waiting: dict[str, T] = {}  # insertion order is arrival order

    def __contains__(self, rid: str) -> bool:
        return rid in self.running or rid in self.waiting

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, rid: str, request: T) -> None:
        """Queue a request behind the waiting ones; the caller keeps rids unique (`rid in admission`)."""
        self.waiting[rid] = request

    def remove(self, rid: str) -> T | None:
        """Drop a request, running or waiting; the removed one, or None if `rid` is not here."""
        if rid in self.running:
            return self.running.pop(rid)
        return self.waiting.pop(rid, None)

    def admit(self) -> dict[str, T]:
        """Move waiting requests to running while there is room; the running ones."""
        running, waiting, cap = self.running, self.waiting, self.cap
        while waiting and (cap is None or len(running) < cap):
            rid = next(iter(waiting))
            running[rid] = waiting.pop(rid)
        return running


Generate = Callable[[list[int], int, list[int], int], Iterator[int | None]]
_END = object()


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


@dataclass(slots=True)
class _Running:
    rid: str
    ids: Iterator[int | None]
    max_tokens: int
    stop_ids: frozenset[int]
    min_tokens: int
    produced: int = 0


class GeneratorEngine:
    def __init__(self, generate: Generate, tokens_per_step: int = 1, max_running: int | None = None) -> None:
        self.generate = generate
        self.tokens_per_step = tokens_per_step
        self.requests: Admission[_Running] = Admission(max_running)
        self.errors: dict[str, str] = {}  # rid -> why its generator failed (the loop takes it)

    def add(self, rid: str, prompt_ids: list[int], max_tokens: int, stop_ids: list[int], min_tokens: int = 0) -> None:
        """Queue a request. `generate` is called now, so a request it cannot serve raises here. A rid already here
        is ignored."""
        if rid in self.requests:
            return
        ids = iter(self.generate(list(prompt_ids), max_tokens, list(stop_ids), min_tokens))
        self.requests.add(rid, _Running(rid, ids, max_tokens, frozenset(stop_ids), min_tokens))

    def cancel(self, rid: str) -> None:
        running = self.requests.remove(rid)
        if running is not None:
            _close(running)

    def has_work(self) -> bool:
        return self.requests.has_work()

    def step(self) -> list[tuple[str, list[int], str | None]]:
        """(rid, new ids, finish or None) of every running request."""
        requests = self.requests.admit()
        out: list[tuple[str, list[int], str | None]] = []
        for rid, running in list(requests.items()):
            try:
                ids, finish = self._next_ids(running)
            except Exception as exc:  # noqa: BLE001 - a failing generation ends its own request only
                log.warning("engine: generation of %s failed: %s", rid, exc)
                self.errors[rid] = f"generation failed: {exc}"
                ids, finish = [], FINISH_ERROR
            out.append((rid, ids, finish))
            if finish is not None:
                del requests[rid]
                _close(running)
        return out

    def _next_ids(self, running: _Running) -> tuple[list[int], str | None]:
        ids: list[int] = []
        while len(ids) < self.tokens_per_step:
            if running.produced >= running.max_tokens:
                return ids, FINISH_LENGTH
            token = next(running.ids, _END)
            if token is None:
                break  # the generator worked without making an id this step
            if token is _END:
                return ids, FINISH_STOP
            assert isinstance(token, int)
            ids.append(token)
            running.produced += 1
            if token in running.stop_ids and running.produced > running.min_tokens:
                return ids, FINISH_STOP
        return ids, FINISH_LENGTH if running.produced >= running.max_tokens else None


def _close(running: _Running) -> None:
    close = getattr(running.ids, "close", None)
    if close is not None:
        close()
