"""Reading GET /metrics of a running front in tests: every sample by name and labels, sums over label subsets, and
polling until a value is reached (worker and engine values arrive at their stats interval)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from helpers.serve_helpers import wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    response = httpx.get(f"{url}/metrics", timeout=5.0)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for (sample, keys), value in samples.items() if sample == name and wanted <= set(keys))


def present(samples: Samples, name: str) -> bool:
    return any(sample == name for sample, _ in samples)


def wait_for_value(url: str, name: str, expected: float, timeout: float = 10.0, **labels: str) -> Samples:
    last: list[float] = []

    def matches() -> Samples | None:
        samples = scrape(url)
        last[:] = [total(samples, name, **labels)]
        return samples if last[0] == expected else None

    try:
        return wait_for(matches, timeout, interval=0.1, what=f"{name}{labels} == {expected}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last value {last}") from None
