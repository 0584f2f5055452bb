"""`qwen3_vllm`: vLLM 0.32's qwen3 reasoning rule (what `--reasoning-parser qwen3` means on `--source vllm`): the
output reasons from its first character until `</think>`, whatever the prompt (with thinking off the front runs no
reasoning parser: tests/unit/front/test_vllm_front_options.py); a `<think>` inside the reasoning and a `</think>` in
the content are dropped; a `<tool_call>` ends the reasoning too and stays content (the tool parser's call). Whole and
however the text is cut, and (random outputs) as vLLM's own parser splits a whole answer."""

from __future__ import annotations

import random

import pytest
from helpers.parse_cases import random_cuts
from helpers.vllm_parsers import vllm_parse

from detok_worker.parse.base import ParsedOutput
from detok_worker.parse.registry import create_parser

CLOSED_IN_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # vLLM's parser does not read it


def parsed(text: str, cuts: list[int], prompt_tail: str) -> ParsedOutput:
    parser = create_parser("qwen3_vllm", "", prompt_tail)
    assert parser is not None
    out = ParsedOutput()
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        if end > start:
            out.extend(parser.feed(text[start:end]))
    out.extend(parser.finish())
    return out


@pytest.mark.parametrize(
    ("text", "prompt_tail", "reasoning", "content"),
    [
        ("plan it</think>\n\nThe answer.", "<|im_start|>assistant\n", "plan it", "\n\nThe answer."),
        ("<think>a<think>b</think>c</think>d", "<|im_start|>assistant\n", "ab", "cd"),
        ("no end marker at all", "<|im_start|>assistant\n", "no end marker at all", ""),
        ("<thin", "<|im_start|>assistant\n", "<thin", ""),
        ("Just the answer.</think> more", CLOSED_IN_PROMPT, "Just the answer.", " more"),
        ("x</thin", "<|im_start|>assistant\n", "x</thin", ""),
        ("look up<tool_call>\n{}</tool_call>", "", "look up", "<tool_call>\n{}</tool_call>"),
        ("a</tool_call>b<tool_call>c</think>d", "", "a</tool_call>b", "<tool_call>cd"),
    ],
)
def test_the_split_is_vllms_and_cut_independent(text: str, prompt_tail: str, reasoning: str, content: str) -> None:
    whole = parsed(text, [], prompt_tail)
    assert (whole.reasoning, whole.content) == (reasoning, content)
    for cut in range(1, len(text)):
        assert parsed(text, [cut], prompt_tail) == whole, cut
    assert parsed(text, list(range(1, len(text))), prompt_tail) == whole


WORDS = [
    "Hmm.",
    " ok",
    "\n",
    "  ",
    "天气",
    " 😀",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "</th",
]


def test_random_outputs_split_as_vllms_qwen3_parser() -> None:
    rng = random.Random(31)
    outputs = ["".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 9))) for _ in range(150)]
    theirs = vllm_parse("qwen3", [("qwen3", "", {}, text) for text in outputs])
    for text, vllms in zip(outputs, theirs, strict=True):
        whole = parsed(text, [], "")
        for _ in range(4):
            assert parsed(text, random_cuts(len(text), rng), "") == whole, text
        assert (whole.reasoning, whole.content, []) == vllms, text
    assert sum(bool(reasoning) and "<tool_call>" in content for reasoning, content, _ in theirs) > 10
