"""schemathesis against the front's own /openapi.json, on a real `detok serve --source echo`: generated valid and
invalid requests for every operation, streaming or not. No response may be a 5xx, responses must match the
documented status codes, content types and schemas, and no process may die.

Left out: positive_data_acceptance (a schema-valid body must be accepted): the document is generated from the
request structs, so it carries types but not the ranges and combinations validation.py enforces (n == 1,
best_of, response_format, min_tokens <= max_tokens, ...): such bodies are rightly a 400. And the schema check of
streamed responses (see call_and_check).

Default suite: 40 examples per operation; `-m slow`: 600."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from helpers.fault_helpers import all_idle, echo_service, service_pids
from helpers.serve_helpers import ServeProcess, wait_for
from hypothesis import HealthCheck, settings

schemathesis = pytest.importorskip("schemathesis")

CHECK_SETTINGS = {"deadline": None, "suppress_health_check": list(HealthCheck), "database": None}


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with echo_service(1, 0) as serve:
        yield serve


@pytest.fixture(scope="module")
def pids(service: ServeProcess) -> dict[str, int]:
    return service_pids(service)


@pytest.fixture
def front_schema(service: ServeProcess, pids: dict[str, int]) -> Any:  # pids: taken before the first case
    return schemathesis.openapi.from_url(f"{service.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("front_schema")


def call_and_check(case: Any) -> None:
    excluded = [schemathesis.checks.positive_data_acceptance]
    if isinstance(case.body, dict) and case.body.get("stream") is True:
        # the document declares an event stream as one string (OpenAPI 3.1); schemathesis validates each event
        # against it (3.2's itemSchema reading). The events themselves are checked in test_front_api.py.
        excluded.append(schemathesis.checks.response_schema_conformance)
    case.call_and_validate(excluded_checks=excluded, timeout=30)


@schema.parametrize()
@settings(max_examples=40, **CHECK_SETTINGS)
def test_front_openapi(case: Any) -> None:
    call_and_check(case)


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=600, **CHECK_SETTINGS)
def test_front_openapi_full(case: Any) -> None:
    call_and_check(case)


def test_every_process_survived(service: ServeProcess, pids: dict[str, int]) -> None:
    """Runs after the generated cases (same module): same processes, healthy, nothing live, no handler error."""
    assert service_pids(service) == pids
    assert service.health() == 200
    wait_for(lambda: all_idle(service), 10, what="live rids 0 everywhere")
    assert service.stats()["front"].get("handler_errors", 0) == 0
