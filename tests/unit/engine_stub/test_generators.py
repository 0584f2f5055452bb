"""GeneratorEngine: per-request generators stepped together. Ids interleave one step at a time, a stop id ends a
request only past min_tokens, None is a step without an id, at most max_running generate at once, a cancelled or
finished generator is closed, and a failing one ends its own request with "error"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine_stub.generators import GeneratorEngine

EOS = 99


class Scripted:
    """generate() that yields each request's scripted ids (the prompt's first id picks the script) and notes
    which generations ended before all their ids were taken."""

    def __init__(self, scripts: dict[int, list[int | None]]) -> None:
        self.scripts = scripts
        self.closed: list[int] = []
        self.calls: list[tuple[int, int, list[int], int]] = []

    def __call__(
        self, prompt_ids: list[int], max_tokens: int, stop_ids: list[int], min_tokens: int
    ) -> Iterator[int | None]:
        key = prompt_ids[0]
        self.calls.append((key, max_tokens, stop_ids, min_tokens))
        if key < 0:
            raise ValueError(f"cannot generate for {key}")
        return self._run(key)

    def _run(self, key: int) -> Iterator[int | None]:
        script = self.scripts[key]
        yielded = 0
        try:
            for token in script:
                if token == -1:
                    raise RuntimeError("decode failed")
                yielded += 1
                yield token
        finally:
            if yielded < len(script):
                self.closed.append(key)


def run_all(engine: GeneratorEngine) -> list[list[tuple[str, list[int], str | None]]]:
    steps = []
    while engine.has_work():
        steps.append(engine.step())
    return steps


def test_requests_advance_together_one_step_at_a_time() -> None:
    scripted = Scripted({1: [10, 11, 12, EOS], 2: [20, 21, 22, 23, 24]})
    engine = GeneratorEngine(scripted)
    engine.add("a", [1], 10, [EOS])
    engine.add("b", [2], 3, [EOS])
    steps = run_all(engine)
    assert steps == [
        [("a", [10], None), ("b", [20], None)],
        [("a", [11], None), ("b", [21], None)],
        [("a", [12], None), ("b", [22], "length")],
        [("a", [EOS], "stop")],
    ]
    assert scripted.closed == [2]  # ended by max_tokens before its generator ran out: closed
    assert scripted.calls[0] == (1, 10, [EOS], 0)


def test_tokens_per_step_and_a_generator_that_ends_on_its_own() -> None:
    engine = GeneratorEngine(Scripted({1: [10, 11, 12]}), tokens_per_step=2)
    engine.add("a", [1], 10, [EOS])
    assert run_all(engine) == [[("a", [10, 11], None)], [("a", [12], "stop")]]


def test_a_stop_id_within_min_tokens_does_not_end_the_request() -> None:
    scripted = Scripted({1: [EOS, 10, EOS, 11, EOS]})
    engine = GeneratorEngine(scripted, tokens_per_step=8)
    engine.add("a", [1], 10, [EOS], min_tokens=3)
    assert run_all(engine) == [[("a", [EOS, 10, EOS, 11, EOS], "stop")]]
    assert scripted.calls[0][3] == 3  # the generator is told, so a model can avoid them


def test_none_is_a_step_without_an_id() -> None:
    engine = GeneratorEngine(Scripted({1: [None, None, 10, EOS]}), tokens_per_step=4)
    engine.add("a", [1], 10, [EOS])
    assert run_all(engine) == [[("a", [], None)], [("a", [], None)], [("a", [10, EOS], "stop")]]


def test_at_most_max_running_generate_and_the_rest_wait_in_order() -> None:
    engine = GeneratorEngine(Scripted({1: [10, EOS], 2: [20, 21, EOS], 3: [30, EOS]}), max_running=2)
    for rid, key in (("a", 1), ("b", 2), ("c", 3)):
        engine.add(rid, [key], 10, [EOS])
    steps = run_all(engine)
    assert [[rid for rid, _, _ in step] for step in steps] == [["a", "b"], ["a", "b"], ["b", "c"], ["c"]]
    assert steps[2] == [("b", [EOS], "stop"), ("c", [30], None)]


def test_cancel_closes_a_running_generator_and_drops_a_waiting_one() -> None:
    scripted = Scripted({1: [10, 11, 12, EOS], 2: [20, EOS]})
    engine = GeneratorEngine(scripted, max_running=1)
    engine.add("a", [1], 10, [EOS])
    engine.add("b", [2], 10, [EOS])
    assert engine.step() == [("a", [10], None)]
    engine.cancel("b")
    engine.cancel("a")
    engine.cancel("unknown")
    assert not engine.has_work()
    assert scripted.closed == [1]


def test_a_failing_generator_ends_its_request_with_an_error_and_others_go_on() -> None:
    engine = GeneratorEngine(Scripted({1: [10, -1], 2: [20, 21, EOS]}))
    engine.add("a", [1], 10, [EOS])
    engine.add("b", [2], 10, [EOS])
    steps = run_all(engine)
    assert steps[1] == [("a", [], "error"), ("b", [21], None)]
    assert steps[2] == [("b", [EOS], "stop")]
    assert engine.errors == {"a": "generation failed: decode failed"}
    with pytest.raises(ValueError, match="cannot generate for -5"):
        engine.add("c", [-5], 10, [EOS])
    assert not engine.has_work()
