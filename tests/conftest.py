"""Session fixtures: the fixture tokenizers, loaded once (helpers/fixtures.py says where their files are)."""

from __future__ import annotations

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer


@pytest.fixture(params=sorted(FIXTURE_TOKENIZER_DIRS), scope="session")
def fixture_tokenizer_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def fixture_tokenizer(fixture_tokenizer_name: str):
    return load_fixture_tokenizer(fixture_tokenizer_name)
