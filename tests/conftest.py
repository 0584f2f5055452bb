"""Session fixtures: the fixture tokenizers, loaded once (helpers/fixtures.py says where their files are)."""

from __future__ import annotations

import os

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer


@pytest.fixture(params=sorted(FIXTURE_TOKENIZER_DIRS), scope="session")
def fixture_tokenizer_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def fixture_tokenizer(fixture_tokenizer_name: str):
    return load_fixture_tokenizer(fixture_tokenizer_name)


@pytest.fixture(scope="session", autouse=True)
def private_fast_path_cache(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The fast path's disk cache of this test run (inherited by the processes tests start), not the user's."""
    previous = os.environ.get("DETOK_CACHE_DIR")
    os.environ["DETOK_CACHE_DIR"] = str(tmp_path_factory.mktemp("detok-cache"))
    yield
    if previous is None:
        os.environ.pop("DETOK_CACHE_DIR", None)
    else:
        os.environ["DETOK_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def qwen3():  # type: ignore[no-untyped-def]
    """The embedded default tokenizer (Qwen3), loaded through the public factory."""
    return load_fixture_tokenizer("qwen3")


@pytest.fixture(scope="session")
def tokenizer(qwen3):  # type: ignore[no-untyped-def]
    """The tokenizer a service test decodes with: the embedded default (a module testing another one overrides it)."""
    return qwen3
