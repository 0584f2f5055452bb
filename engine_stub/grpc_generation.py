"""The gRPC engine server's generating source (llama-cpp): the requests of every Generate stream in one
GeneratorEngine, stepped by one asyncio task. A step runs in a worker thread (llama.cpp releases the GIL while it
decodes), so Abort, new streams and other clients are served meanwhile; requests are added and cancelled only
between steps, on the event loop, so the engine is never touched from two threads at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from detok_worker.bus.messages import FINISH_ABORT, FINISH_ERROR
from engine_stub.generators import GeneratingSource, GeneratorEngine

# one step's news for a stream: (new ids, finish or None, error or None)
StepNews = tuple[list[int], str | None, str | None]


@dataclass(slots=True)
class Generation:
    rid: str
    prompt_ids: list[int]
    max_tokens: int
    stop_ids: list[int]
    min_tokens: int
    steps: asyncio.Queue[StepNews] = field(default_factory=asyncio.Queue)


class GenerationRuns:
    def __init__(self, source: GeneratingSource, tokens_per_step: int, step_s: float) -> None:
        self.engine = GeneratorEngine(source.generate, tokens_per_step, source.max_running)
        self.step_s = step_s
        self.live: dict[str, Generation] = {}
        self._adds: list[Generation] = []
        self._cancels: list[str] = []
        self._task: asyncio.Task[None] | None = None

    def submit(self, generation: Generation) -> None:
        """Start generating at the next step; its news arrive on generation.steps (a request the source cannot
        serve gets one item with the error and no finish)."""
        self._adds.append(generation)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def cancel(self, rid: str, *, notify: bool = False) -> None:
        """Stop generating `rid` (before the next step); with notify its stream gets a last "abort" item."""
        generation = self.live.pop(rid, None) or next((g for g in self._adds if g.rid == rid), None)
        if generation is None:
            return
        self._cancels.append(rid)
        if notify:
            generation.steps.put_nowait(([], FINISH_ABORT, None))

    async def _run(self) -> None:
        try:
            while True:
                self._apply()
                if not self.engine.has_work():
                    return
                for rid, ids, finish in await asyncio.to_thread(self.engine.step):
                    self._report(rid, ids, finish)
                if self.step_s:
                    await asyncio.sleep(self.step_s)
        finally:
            self._task = None

    def _apply(self) -> None:
        adds, self._adds = self._adds, []
        for generation in adds:
            try:
                self.engine.add(
                    generation.rid,
                    generation.prompt_ids,
                    generation.max_tokens,
                    generation.stop_ids,
                    generation.min_tokens,
                )
            except ValueError as exc:
                generation.steps.put_nowait(([], None, f"the engine's token source failed: {exc}"))
                continue
            self.live[generation.rid] = generation
        cancels, self._cancels = self._cancels, []
        for rid in cancels:
            self.live.pop(rid, None)
            self.engine.cancel(rid)

    def _report(self, rid: str, ids: list[int], finish: str | None) -> None:
        generation = self.live.get(rid)
        if generation is None:
            return  # cancelled while the step ran
        error = self.engine.errors.pop(rid, "generation failed") if finish == FINISH_ERROR else None
        generation.steps.put_nowait((ids, finish, error))
        if finish is not None:
            del self.live[rid]
