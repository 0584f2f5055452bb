"""The reasoning tokens of a chat usage (completion_tokens_details) counted as vLLM 0.32's own parsers count them:
random outputs of ids with each family's marker tokens among them, after prompts that open, close or leave out the
think block, counted by detok in random batches and by vLLM's parser of that name (run in vLLM's virtualenv, through
the calls its chat server makes for a whole answer, thinking off given as its chat server gives it: the template
argument that closes the block in the prompt). On each family's vocabulary where the fixtures have it (Qwen3's),
else on a fixture with the family's markers added as special tokens (helpers/fixtures.py MARKED_FIXTURES). olmo3,
granite and minimax_m2_append_think count none, in vLLM as in detok."""

from __future__ import annotations

import random

from helpers.fixtures import load_fixture_tokenizer
from helpers.vllm_parsers import run_in_vllm

from detok_worker.parse.registry import COUNTED_REASONING, THINKING_SWITCHED, reasoning_token_count

PROMPT_TAILS = (
    "<|im_start|>assistant\n",
    "<|im_start|>assistant\n<think>\n",
    "<|im_start|>assistant\n<think>\n\n</think>\n\n",
)
THINK = ("<think>", "</think>")
# detok's parser -> vLLM's name for it, the fixture tokenizer, the marker tokens among the random ids
FAMILIES = {
    "qwen3_vllm": ("qwen3", "qwen3", (*THINK, "<tool_call>", "</tool_call>")),
    "deepseek_r1": ("deepseek_r1", "qwen3", THINK),
    "glm45": ("glm45", "qwen3", (*THINK, "<tool_call>", "</tool_call>")),  # GLM's markers are Qwen3's tokens too
    "kimi_k2": (
        "kimi_k2",
        "kimi-markers",
        (*THINK, "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_end|>"),
    ),
    "minimax_m2": ("minimax_m2", "minimax-markers", (*THINK, "<minimax:tool_call>", "</minimax:tool_call>")),
    "minimax_m2_append_think": ("minimax_m2_append_think", "qwen3", THINK),
    "olmo3": ("olmo3", "qwen3", THINK),
    "granite": ("granite", "qwen3", THINK),
    "deepseek_v3": ("deepseek_v3", "qwen3", THINK),
}
TOKENIZERS = sorted({tokenizer for _, tokenizer, _ in FAMILIES.values()})

VLLM_SCRIPT = """
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.tokenizers import get_tokenizer

tokenizers = [get_tokenizer(folder) for folder in sys.argv[1:]]
cases = json.loads(sys.stdin.read())
counts = []
for name, which, tail, kwargs, ids in cases:
    tokenizer = tokenizers[which]
    parser_cls = ParserManager.get_parser(reasoning_parser_name=name, tokenizer=tokenizer)
    parser = parser_cls(tokenizer, None, model_config=None, chat_template_kwargs=kwargs)
    parser.set_prompt_token_ids(tokenizer.encode(tail, add_special_tokens=False))
    request = ChatCompletionRequest(messages=[])
    parser.parse(tokenizer.decode(ids), request, enable_auto_tools=False, model_output_token_ids=ids)
    counts.append(parser.count_reasoning_tokens(ids))
print(json.dumps(counts))
"""


def random_output(marker_ids: list[int], rng: random.Random) -> list[int]:
    ids = [rng.randrange(1000, 30000) for _ in range(rng.randrange(0, 12))]
    for _ in range(rng.randrange(0, 6)):
        ids.insert(rng.randrange(0, len(ids) + 1), rng.choice(marker_ids))
    return ids


def template_arguments(name: str, tail: str) -> dict[str, bool]:
    """The chat's template arguments that give this prompt tail: thinking off closes the block in the prompt
    (deepseek_v3 thinks only when they ask)."""
    if tail.endswith("</think>\n\n"):
        return {"enable_thinking": False}
    return {"thinking": True} if name == "deepseek_v3" else {}


def detok_count(name: str, tail: str, ids: list[int], rng: random.Random) -> int:
    if name in THINKING_SWITCHED and not THINKING_SWITCHED[name](template_arguments(name, tail)):
        return 0  # thinking off: the front runs no parser
    counter = reasoning_token_count(name, load_fixture_tokenizer(FAMILIES[name][1]).token_to_id)
    if counter is None:
        return 0
    at = 0
    while at < len(ids):
        size = rng.randrange(1, 5)
        counter.add(ids[at : at + size])
        at += size
    return counter.count


def test_detoks_count_is_vllms_in_any_batches() -> None:
    rng = random.Random(7)
    cases = []
    for name, (_, tokenizer, markers) in FAMILIES.items():
        marker_ids = [load_fixture_tokenizer(tokenizer).token_to_id(marker) for marker in markers]
        cases += [(name, rng.choice(PROMPT_TAILS), random_output(marker_ids, rng)) for _ in range(60)]
    vllm_cases = [
        (FAMILIES[name][0], TOKENIZERS.index(FAMILIES[name][1]), tail, template_arguments(name, tail), ids)
        for name, tail, ids in cases
    ]
    vllm_counts = run_in_vllm(VLLM_SCRIPT, vllm_cases, *TOKENIZERS)
    mine = [detok_count(name, tail, ids, rng) for name, tail, ids in cases]
    differing = [
        (case, ours, theirs) for case, ours, theirs in zip(cases, mine, vllm_counts, strict=True) if ours != theirs
    ]
    assert not differing, differing[:5]
    for name in FAMILIES:  # each family that counts counts in some outputs, and not in all
        counts = [count for (family, _, _), count in zip(cases, mine, strict=True) if family == name]
        assert (any(counts) and not all(counts)) if COUNTED_REASONING[name] else not any(counts)
