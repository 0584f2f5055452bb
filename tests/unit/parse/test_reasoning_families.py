"""The reasoning parsers of vLLM 0.32's other families (glm45, kimi_k2, minimax_m2, minimax_m2_append_think, olmo3,
granite, deepseek_v3): random outputs of each family's markup (its markers, the other families', whitespace, CJK and
emoji, a marker cut by the end of the output), parsed by detok in random pieces and whole, and by vLLM's own parser
of that name (in vLLM's virtualenv) on the whole text, as its chat server reads a whole answer: the same reasoning
and content. Where the chat's template arguments turn thinking off (glm45, kimi_k2; deepseek_v3 unless they turn it
on), the front runs no reasoning parser (THINKING_SWITCHED) and vLLM's parser returns the output as content. The
recorded cases of these families (helpers/parse_cases.py, with their tool-call parsers) are vLLM's split too.

The differences kept, each where vLLM's streaming already splits the output as detok does: an olmo3 output without
`</think>` reasons (vLLM's whole answer: all content); a granite output that opens with its thought phrase but never
writes its response phrase reasons (vLLM's whole answer: all content), and one that does not open with the thought
phrase is content (vLLM's whole answer finds the phrases further in, and drops the text before them). deepseek_v3's
outputs hold no `<think>` (its chat template writes it into the prompt); where one stands after other text, vLLM's
whole answer drops that text, which detok (as its deepseek_r1) keeps in the reasoning. Kept out of
the outputs: a minimax_m2 `</minimax:tool_call>` that no opening call markup precedes, which vLLM drops from the
content and detok keeps."""

from __future__ import annotations

import random
from typing import Any

from helpers.parse_cases import CASES, random_cuts
from helpers.vllm_parsers import Parsed, vllm_parse

from detok_worker.parse.base import ParsedOutput
from detok_worker.parse.registry import THINKING_SWITCHED, create_parser

GRANITE_REASONING_START = ("Here is my thought process:", "Here's my thought process:")
GRANITE_REASONING_END = ("Here is my response:", "Here's my response:")
WORDS = ["Hmm.", " ok", "\n", "  ", "\t", "天气", " 😀", "x y"]
THINK = ["<think>", "</think>", "<think>", "</think>", "</thi", "<th"]
MARKUP = {
    "glm45": ["<tool_call>", "</tool_call>", "<arg_key>", "get_weather", "</arg_key>", "<arg_value>"],
    "kimi_k2": ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.f:0", "<|tool_calls_section_end|>"],
    "minimax_m2": ["<minimax:tool_call>", '<invoke name="f">', "</invoke>", "<parameter name=", ">"],
    "minimax_m2_append_think": ["<minimax:tool_call>", '<invoke name="f">'],
    "olmo3": ["<tool_call>"],
    "granite": [*GRANITE_REASONING_START, *GRANITE_REASONING_END, "Here is my", "Here", ":", "<think>"],
    "deepseek_v3": ["<｜tool▁calls▁begin｜>", "<｜Assistant｜>"],
}
# the template arguments of a family's random outputs: deepseek_v3 thinks only when they ask
THINKING_ON: dict[str, dict[str, Any]] = {"deepseek_v3": {"thinking": True}}
TEMPLATE_ARGUMENTS: list[dict[str, Any]] = [
    {}, {"thinking": False}, {"enable_thinking": False}, {"thinking": True, "enable_thinking": False},
    {"thinking": None}, {"enable_thinking": True},
]  # fmt: skip


def random_output(family: str, rng: random.Random) -> str:
    think = [marker for marker in THINK if marker != "<think>"] if family == "deepseek_v3" else THINK
    alphabet = WORDS + think + MARKUP[family]
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 9)))
    if family == "granite" and rng.random() < 0.6:  # mostly the shape of its answers
        text = rng.choice(GRANITE_REASONING_START) + text
        if rng.random() < 0.8:
            text += rng.choice(GRANITE_REASONING_END) + rng.choice(WORDS)
    if family == "minimax_m2" and rng.random() < 0.3:  # a call block, closed
        text += "<minimax:tool_call>" + rng.choice(WORDS) + "</minimax:tool_call>" + rng.choice(WORDS)
    return text


def parsed(reasoning_parser: str, text: str, cuts: list[int]) -> Parsed:
    parser = create_parser(reasoning_parser, "")
    if parser is None:  # thinking off: no reasoning parser
        return "", text, []
    out = ParsedOutput()
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        out.extend(parser.feed(text[start:end]))
    out.extend(parser.finish())
    assert not out.tool_calls
    return out.reasoning, out.content, []


def parser_run(family: str, template_arguments: dict[str, Any]) -> str:
    """The reasoning parser the front names for a chat with these template arguments (front/parsing.py)."""
    switch = THINKING_SWITCHED.get(family)
    return "" if switch is not None and not switch(template_arguments) else family


def known_difference(family: str, text: str, detoks: Parsed, vllms: Parsed) -> bool:
    """Whether detok's and vLLM's parse differ as the module's docstring says they may."""
    if family == "olmo3" and "</think>" not in text:
        return detoks == (text.removeprefix("<think>"), "", []) and vllms == ("", text, [])
    if family == "granite":
        opening = next((start for start in GRANITE_REASONING_START if text.startswith(start)), "")
        if not opening:
            return detoks == ("", text, [])
        rest = text[len(opening) :]
        return not any(end in rest for end in GRANITE_REASONING_END) and (detoks, vllms) == (
            (rest, "", []),
            ("", text, []),
        )
    return False


def test_detoks_split_is_vllms_in_any_pieces() -> None:
    rng = random.Random(45)
    cases = [(family, THINKING_ON.get(family, {}), random_output(family, rng)) for family in MARKUP for _ in range(70)]
    switched = [family for family in MARKUP if family in THINKING_SWITCHED]
    cases += [(family, kwargs, random_output(family, rng)) for family in switched for kwargs in TEMPLATE_ARGUMENTS]
    recorded = [case for case in CASES if case.reasoning_parser in MARKUP]
    theirs = vllm_parse(
        "qwen3",
        [(family, "", arguments, text) for family, arguments, text in cases]
        + [(case.reasoning_parser, case.tool_call_parser, {}, case.output) for case in recorded],
    )
    for case, vllms in zip(recorded, theirs[len(cases) :], strict=True):  # the recorded cases' split is vLLM's
        assert vllms == (case.reasoning, case.content, case.tool_calls), case.name
    theirs = theirs[: len(cases)]
    differences = 0
    for (family, arguments, text), vllms in zip(cases, theirs, strict=True):
        reasoning_parser = parser_run(family, arguments)
        whole = parsed(reasoning_parser, text, [])
        for _ in range(4):
            assert parsed(reasoning_parser, text, random_cuts(len(text), rng)) == whole, (family, text)
        if whole != vllms:
            assert known_difference(family, text, whole, vllms), (family, arguments, text, whole, vllms)
            differences += 1
    assert differences < len(cases) // 10
    for family in MARKUP:  # each family reasons in many outputs (but append_think: never), and writes content
        splits = [vllms for (name, _, _), vllms in zip(cases, theirs, strict=True) if name == family]
        reasoned = sum(bool(reasoning) for reasoning, _, _ in splits)
        assert reasoned == 0 if family == "minimax_m2_append_think" else reasoned > 20
        assert sum(bool(content) for _, content, _ in splits) > 10
