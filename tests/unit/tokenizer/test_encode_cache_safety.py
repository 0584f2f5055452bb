"""The per-tokenizer split-safety check behind L1: on the fixture tokenizers and on real tokenizers rebuilt with
the features that break a naive prefix split (prepend-on-first Metaspace, a post-processor adding BOS and EOS,
special tokens that eat whitespace or need word boundaries, truncation, padding, no atomic special tokens).
Whatever the check decides, the cache's output must be the tokenizer's own."""

from __future__ import annotations

import json
import logging
import lzma
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.encode_cache_corpus import chat_prompts, edge_strings
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer

from detok_worker.tokenizer import create_tokenizer
from detok_worker.tokenizer.encode_cache import CachedTokenizer
from detok_worker.tokenizer.encode_cache.split_safety import plan_prefix_split
from detok_worker.tokenizer.protocol import Tokenizer

TEMPLATE_TOKENS = {
    "qwen3": ["<|im_start|>", "<|im_end|>"],
    "deepseek-v3": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"],
    "gpt-oss": ["<|start|>", "<|message|>", "<|end|>"],
    "mistral-sp-v1": ["<s>", "</s>"],
    # no chat template: their special tokens
    "gpt4o": ["<|endoftext|>", "<|endofprompt|>"],
    "gpt35turbo": ["<|endoftext|>", "<|endofprompt|>"],
    "claude": ["<EOT>", "<META>"],
}


def variant(tmp_path: Path, name: str, change: Callable[[dict[str, Any]], None]) -> Tokenizer:
    """The fixture tokenizer `name` with its tokenizer.json changed, loaded through the public factory."""
    source = FIXTURE_TOKENIZER_DIRS[name]
    target = tmp_path / name
    target.mkdir()
    spec = json.loads(lzma.decompress((source / "tokenizer.json.xz").read_bytes()))
    change(spec)
    (target / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    shutil.copy(source / "tokenizer_config.json", target / "tokenizer_config.json")
    return create_tokenizer(str(target))


def assert_exact(name: str, tokenizer: Tokenizer, cached: CachedTokenizer) -> None:
    prompts = chat_prompts(name, tokenizer, count=10) + edge_strings(tokenizer)
    for flag in (False, True):
        expected = tokenizer.encode_batch(prompts, flag)
        for _ in range(2):  # misses, then hits
            for prompt, want in zip(prompts, expected, strict=True):
                got = cached.encode(prompt, flag)
                assert (got.ids, got.offsets) == (want.ids, want.offsets), (flag, prompt[:200])


def set_added_token(spec: dict[str, Any], contents: set[str], **fields: Any) -> None:
    for token in spec["added_tokens"]:
        if token["content"] in contents:
            token.update(fields)


@pytest.mark.parametrize("name", sorted(FIXTURE_TOKENIZER_DIRS))
def test_l1_splits_every_fixture_at_its_chat_template_tokens(name: str) -> None:
    tokenizer = load_fixture_tokenizer(name)
    plan = plan_prefix_split(tokenizer)
    assert plan.disabled == {} and set(plan.framings) == {False, True}
    assert plan.finder is not None and set(TEMPLATE_TOKENS[name]) <= set(plan.finder.token_ids)
    assert plan.dropped_tokens == {}
    assert plan.framings[False].lead_ids == plan.framings[False].trail_ids == ()


def test_framing_of_add_special_tokens_is_measured_per_tokenizer() -> None:
    # mistral-sp-v1's post-processor puts BOS in front; Qwen3's adds nothing
    mistral = load_fixture_tokenizer("mistral-sp-v1")
    framing = plan_prefix_split(mistral).framings[True]
    assert framing.lead_ids == (mistral.token_to_id("<s>"),) and framing.trail_ids == ()
    qwen = plan_prefix_split(load_fixture_tokenizer("qwen3")).framings[True]
    assert qwen.lead_ids == qwen.trail_ids == ()


def test_metaspace_prepend_first_is_split_exactly(tmp_path: Path) -> None:
    def first_only(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"]["prepend_scheme"] = "first"

    tokenizer = variant(tmp_path, "mistral-sp-v1", first_only)
    # what makes a naive split wrong here: "hello" alone gets "▁" prepended, after a special token it does not
    naive = tokenizer.encode("</s>").ids + tokenizer.encode("hello").ids
    assert tokenizer.encode("</s>hello").ids != naive
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 24)
    assert cached.stats().l1.enabled and cached.stats().l1.boundary_tokens == 3
    assert_exact("mistral-sp-v1", tokenizer, cached)
    assert cached.stats().l1.hits > 100 and cached.stats().l1.unaligned == 0


def legacy_sentencepiece_normalizer(spec: dict[str, Any]) -> None:
    # how older Llama/Mistral conversions spell SentencePiece: "▁" prepended and spaces replaced by the normalizer
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    spec["pre_tokenizer"] = None


def lowercasing_normalizer(spec: dict[str, Any]) -> None:
    spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    for token in spec["added_tokens"]:
        token["normalized"] = True  # special tokens matched after normalization


@pytest.mark.parametrize(
    ("name", "change"), [("mistral-sp-v1", legacy_sentencepiece_normalizer), ("qwen3", lowercasing_normalizer)]
)
def test_normalizer_variants_are_split_exactly(
    tmp_path: Path, name: str, change: Callable[[dict[str, Any]], None]
) -> None:
    tokenizer = variant(tmp_path, name, change)
    cached = CachedTokenizer(tokenizer, l0_max_entries=1000, l1_max_memory=1 << 24)
    assert_exact(name, tokenizer, cached)
    stats = cached.stats().l1
    assert stats.enabled and stats.hits > 40 and stats.unaligned == 0


def test_post_processor_adding_bos_and_eos_gives_one_of_each(tmp_path: Path) -> None:
    def bos_and_eos(spec: dict[str, Any]) -> None:
        spec["post_processor"]["single"].append({"SpecialToken": {"id": "</s>", "type_id": 0}})
        spec["post_processor"]["special_tokens"]["</s>"] = {"id": "</s>", "ids": [2], "tokens": ["</s>"]}

    tokenizer = variant(tmp_path, "mistral-sp-v1", bos_and_eos)
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    framing = plan_prefix_split(tokenizer).framings[True]
    assert (framing.lead_ids, framing.trail_ids) == ((bos,), (eos,))
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 24)
    history = "[INST] Hi [/INST] Hello!</s>"
    cached.encode(history + "[INST] first [/INST]", True)
    result = cached.encode(history + "[INST] second [/INST]", True)
    assert cached.stats().l1.hits == 1
    assert result.ids[0] == bos and result.ids.count(bos) == 1
    assert result.ids[-1] == eos and result.ids.count(eos) == 2  # the one in the text and the appended one
    assert_exact("mistral-sp-v1", tokenizer, cached)


@pytest.mark.parametrize(
    ("flag", "tokens"),
    [("rstrip", {"<|im_end|>"}), ("lstrip", {"<|im_start|>"}), ("single_word", {"<|im_start|>", "<|im_end|>"})],
)
def test_tokens_that_take_neighbouring_text_are_not_boundaries(tmp_path: Path, flag: str, tokens: set[str]) -> None:
    tokenizer = variant(tmp_path, "qwen3", lambda spec: set_added_token(spec, tokens, **{flag: True}))
    plan = plan_prefix_split(tokenizer)
    assert set(plan.dropped_tokens) == tokens
    assert plan.finder is not None and not tokens & set(plan.finder.token_ids)
    cached = CachedTokenizer(tokenizer, l0_max_entries=1000, l1_max_memory=1 << 24)
    assert cached.stats().l1.dropped_tokens == len(tokens)
    assert_exact("qwen3", tokenizer, cached)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("truncation", {"direction": "Right", "max_length": 100_000, "strategy": "LongestFirst", "stride": 0}),
        (
            "padding",
            {
                "strategy": {"Fixed": 64},
                "direction": "Right",
                "pad_to_multiple_of": None,
                "pad_id": 0,
                "pad_type_id": 0,
                "pad_token": "<|endoftext|>",
            },
        ),
    ],
)
def test_length_dependent_tokenizers_get_no_l1(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, setting: str, value: dict[str, Any]
) -> None:
    tokenizer = variant(tmp_path, "qwen3", lambda spec: spec.__setitem__(setting, value))
    with caplog.at_level(logging.WARNING, logger="detok_worker.tokenizer.encode_cache"):
        cached = CachedTokenizer(tokenizer, l0_max_entries=100, l1_max_memory=1 << 24)
    stats = cached.stats().l1
    assert not stats.enabled and set(stats.disabled_reasons) == {"False", "True"}
    assert "truncates or pads" in stats.disabled_reasons["False"]
    assert "encode cache L1 is off for qwen3" in caplog.text
    assert_exact("qwen3", tokenizer, cached)
    assert cached.stats().l1.hits == 0


def test_truncation_shorter_than_the_probes_is_found_by_test_encodes(tmp_path: Path) -> None:
    truncation = {"direction": "Right", "max_length": 60, "strategy": "LongestFirst", "stride": 0}
    tokenizer = variant(tmp_path, "qwen3", lambda spec: spec.__setitem__("truncation", truncation))

    class BareProtocol:  # the same real tokenizer behind the bare protocol: its config is out of sight
        name = tokenizer.name
        vocab_size = tokenizer.vocab_size
        special_tokens = tokenizer.special_tokens
        special_token_ids = tokenizer.special_token_ids
        eos_token_ids = tokenizer.eos_token_ids
        encode = tokenizer.encode
        encode_batch = tokenizer.encode_batch
        decode = tokenizer.decode
        token_to_id = tokenizer.token_to_id
        id_to_token = tokenizer.id_to_token

    assert not hasattr(BareProtocol(), "hf_tokenizer")
    plan = plan_prefix_split(BareProtocol())  # type: ignore[arg-type]
    assert plan.framings == {} and set(plan.disabled) == {False, True}


def test_without_atomic_special_tokens_l1_is_off_with_the_reason(tmp_path: Path) -> None:
    def plain_vocabulary(spec: dict[str, Any]) -> None:
        spec["added_tokens"] = []
        spec["post_processor"] = None

    tokenizer = variant(tmp_path, "mistral-sp-v1", plain_vocabulary)
    assert len(tokenizer.encode("<s>").ids) > 1  # "<s>" is now ordinary text
    cached = CachedTokenizer(tokenizer, l1_max_memory=1 << 24)
    stats = cached.stats().l1
    assert not stats.enabled and "no special token is encoded atomically" in stats.disabled_reasons["False"]
    assert_exact("mistral-sp-v1", tokenizer, cached)
