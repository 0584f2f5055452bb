"""The e2e session's shared vLLM server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers.vllm_cpu import REFERENCE_MAX_NUM_SEQS, VllmServer, vllm_server


@pytest.fixture(scope="session")
def reference_vllm() -> Iterator[VllmServer]:
    """vLLM's own server on the shared engine flags (and a batch of REFERENCE_MAX_NUM_SEQS), started once for the
    modules that compare detok with it (test_vllm_engine, then test_vllm_metrics, which stops it when done: an idle
    server need not outlive them). Each compares what it sent since its own start (metric deltas, its requests)."""
    with vllm_server("--max-num-seqs", str(REFERENCE_MAX_NUM_SEQS)) as server:
        yield server
