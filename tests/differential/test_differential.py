"""Every family through every kind of case, checked per step (check.py). Default: bounded; `slow`: many more."""

from __future__ import annotations

import pytest

from differential.cases import byte_prefixes, canonical, long_invalid_runs, prompt_cuts, random_ids, special_runs
from differential.check import check_stream
from differential.families import FAMILIES, loaded
from differential.tally import CASES

NAMES = sorted(FAMILIES)
SHORT_RUNS = [0, 1, 2, 5, 62, 63, 64, 65, 127, 128, 129, 130, 300]


def _run(name: str, cases, path: str = "auto") -> int:
    tokenizer, model = loaded(name)
    count = 0
    for prompt, generated, skip in cases:
        total = check_stream(name, prompt, generated, skip, path, tokenizer=tokenizer, model=model)
        if not model.byte_fallback or not prompt:
            assert total == model.expected(prompt, generated, skip)
        count += 1
    CASES[name] += count
    return count


@pytest.mark.parametrize("name", NAMES)
def test_family_streams_exactly(name: str) -> None:
    tokenizer, model = loaded(name)
    count = _run(name, canonical(tokenizer, 150))
    count += _run(name, random_ids(tokenizer, model, seed=1, count=60))
    count += _run(name, byte_prefixes(tokenizer, model))
    count += _run(name, special_runs(tokenizer, model, SHORT_RUNS))
    count += _run(name, prompt_cuts(tokenizer, model, limit=6))
    count += _run(name, long_invalid_runs(tokenizer, model, [1, 3, 126, 127, 128, 129]))
    assert count >= 100


@pytest.mark.slow
@pytest.mark.timeout(1800)  # thousands of per-step checked cases per family; minutes on a busy machine
@pytest.mark.parametrize("name", NAMES)
def test_family_streams_exactly_many_cases(name: str) -> None:
    tokenizer, model = loaded(name)
    count = _run(name, canonical(tokenizer, 100_000))
    for seed in range(20):
        count += _run(name, random_ids(tokenizer, model, seed=100 + seed, count=200))
    count += _run(name, special_runs(tokenizer, model, list(range(301))))
    count += _run(name, prompt_cuts(tokenizer, model, limit=400))
    count += _run(name, long_invalid_runs(tokenizer, model, list(range(1, 300, 7))))
    for path in ("generic",):
        count += _run(name, byte_prefixes(tokenizer, model), path)
    assert count >= 4000
