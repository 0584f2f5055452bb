"""A step-wise engine made of per-request token generators, for the EngineLink loop (docs/protocol.md, section 5).

Any `generate(prompt_ids, max_tokens, stop_ids) -> Iterator[int]` plugs in: a model run greedily on CPU, a test's
echo. Each step takes the next tokens_per_step ids of every request; a request ends "stop" at a stop id (or when
its generator ends on its own) and "length" at max_tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from detok_worker.bus.messages import FINISH_LENGTH, FINISH_STOP

Generate = Callable[[list[int], int, list[int]], Iterator[int]]


@dataclass(slots=True)
class _Running:
    ids: Iterator[int]
    max_tokens: int
    stop_ids: frozenset[int]
    produced: int = 0


class GeneratorEngine:
    def __init__(self, generate: Generate, tokens_per_step: int = 1) -> None:
        self.generate = generate
        self.tokens_per_step = tokens_per_step
        self.running: dict[str, _Running] = {}

    def add(self, rid: str, prompt_ids: list[int], max_tokens: int, stop_ids: list[int]) -> None:
        ids = iter(self.generate(list(prompt_ids), max_tokens, list(stop_ids)))
        self.running[rid] = _Running(ids, max_tokens, frozenset(stop_ids))

    def cancel(self, rid: str) -> None:
        running = self.running.pop(rid, None)
        close = getattr(running.ids, "close", None) if running is not None else None
        if close is not None:
            close()

    def step(self) -> list[tuple[str, list[int], str | None]]:
        """(rid, new ids, finish or None) of every running request."""
        out: list[tuple[str, list[int], str | None]] = []
        for rid, running in list(self.running.items()):
            ids, finish = self._next_ids(running)
            out.append((rid, ids, finish))
            if finish is not None:
                del self.running[rid]
        return out

    def _next_ids(self, running: _Running) -> tuple[list[int], str | None]:
        ids: list[int] = []
        while len(ids) < self.tokens_per_step:
            if running.produced >= running.max_tokens:
                return ids, FINISH_LENGTH
            token = next(running.ids, None)
            if token is None:
                return ids, FINISH_STOP
            ids.append(token)
            running.produced += 1
            if token in running.stop_ids:
                return ids, FINISH_STOP
        return ids, FINISH_LENGTH if running.produced >= running.max_tokens else None
