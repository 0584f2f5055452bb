"""The encode cache's split plan on disk (`read_plan`, `write_plan`): a plan read back is
the plan test encodes give; another tokenizer file or other special tokens miss; a damaged file is replanned."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest

from detok_worker.tokenizer import DEFAULT_TOKENIZER_DIR, create_tokenizer
from detok_worker.tokenizer.encode_cache import cache as encode_cache
from detok_worker.tokenizer.encode_cache.split_safety import SplitPlan, plan_key, plan_prefix_split, read_plan
from detok_worker.tokenizer.loading import load_cache


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(load_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def as_tuple(plan: SplitPlan) -> tuple[object, ...]:
    boundaries = plan.finder.token_ids if plan.finder is not None else None
    return boundaries, plan.framings, plan.disabled, plan.dropped_tokens


def test_a_stored_plan_is_the_planned_one_and_needs_no_test_encode(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = encode_cache.split_plan_for(create_tokenizer(DEFAULT_TOKENIZER_DIR))
    assert len(list((cache_root / "split-plan").glob("*.json"))) == 1

    def refuse(_: object) -> SplitPlan:
        raise AssertionError("a stored plan must not be planned again")

    monkeypatch.setattr(encode_cache, "plan_prefix_split", refuse)
    tokenizer = create_tokenizer(DEFAULT_TOKENIZER_DIR)
    stored = encode_cache.split_plan_for(tokenizer)
    assert planned.finder is not None and stored is not planned
    assert as_tuple(stored) == as_tuple(planned) == as_tuple(plan_prefix_split(tokenizer))
    text = "<|im_start|>system\nHi<|im_end|>\n<|im_start|>user\n"
    assert stored.finder is not None and stored.finder.find(text) == planned.finder.find(text)


def test_another_tokenizer_file_or_other_special_tokens_miss(cache_root: Path, tmp_path: Path) -> None:
    key = plan_key(create_tokenizer(DEFAULT_TOKENIZER_DIR))
    copy = tmp_path / "qwen3"
    shutil.copytree(DEFAULT_TOKENIZER_DIR, copy)
    assert plan_key(create_tokenizer(copy)) == key  # keyed by content, not by path
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|endoftext|>"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert plan_key(create_tokenizer(copy)) != key
    source = copy / "tokenizer.json.xz"
    same_tokenizer_other_bytes = lzma.decompress(source.read_bytes()) + b"\n"
    source.write_bytes(lzma.compress(same_tokenizer_other_bytes, preset=0))
    assert plan_key(create_tokenizer(copy)) not in (key, None)


def test_a_damaged_or_foreign_file_is_replanned(cache_root: Path) -> None:
    planned = encode_cache.split_plan_for(create_tokenizer(DEFAULT_TOKENIZER_DIR))
    (path,) = (cache_root / "split-plan").glob("*.json")
    for damage in ("not json", '{"key": "another"}', json.dumps({"key": path.stem, "boundaries": 3})):
        path.write_text(damage)
        assert read_plan(path.stem) is None
        assert as_tuple(encode_cache.split_plan_for(create_tokenizer(DEFAULT_TOKENIZER_DIR))) == as_tuple(planned)
        stored = read_plan(path.stem)  # written again
        assert stored is not None and as_tuple(stored) == as_tuple(planned)
