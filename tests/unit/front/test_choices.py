"""The n choices of a request: their news in index order, and the text that arrives together with an end or a
failure is still handed out (the handler sends it before the error)."""

from __future__ import annotations

import asyncio

from detok_worker.bus.messages import DetokParams, TextDelta
from detok_worker.front.choices import Choices
from detok_worker.front.request_stream import RequestStream
from detok_worker.stream.stop.rules import StopLimits, StopRules


def _choices(n: int) -> Choices:
    rules = StopRules.from_params(DetokParams(), StopLimits())
    wakeup = asyncio.Event()
    return Choices("r", [RequestStream(f"r-{i}", 3, 1e18, rules, wakeup=wakeup) for i in range(n)])


def _drain(choices: Choices) -> list[tuple[int, object, bool]]:
    async def run() -> list[tuple[int, object, bool]]:
        seen = []
        while True:
            seen += await choices.changes()
            if choices.finished:
                return seen

    return asyncio.run(run())


def test_text_that_came_before_a_failure_is_handed_out() -> None:
    choices = _choices(1)
    stream = choices.streams[0]
    stream.accept(TextDelta("r-0", 0, "Partial", 2))
    stream.accept(TextDelta("r-0", 7, " text", 3, finish="error", error="engine failed"))
    assert choices.failure is not None and choices.finished
    assert _drain(choices) == [(0, "Partial text", True)]


def test_each_choice_reports_its_text_and_its_end_once() -> None:
    choices = _choices(2)
    choices.streams[1].accept(TextDelta("r-1", 0, "b", 1, finish="stop"))
    choices.streams[0].accept(TextDelta("r-0", 0, "a", 1, finish="length"))
    assert _drain(choices) == [(0, "a", True), (1, "b", True)]
    assert choices.finish == "length,stop" and choices.usage().completion_tokens == 2
