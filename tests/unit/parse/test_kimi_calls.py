"""Kimi-K2's tool calls (`--tool-call-parser kimi_k2`, alone and after `--reasoning-parser kimi_k2`): random outputs
of calls, text and stray markup, parsed by detok in random pieces and whole, and by vLLM 0.32's own parsers of the
family (in vLLM's virtualenv) on the whole text, as its chat server reads a whole answer: the same reasoning,
content and calls.

Kept out of the outputs, as known differences: a call whose header has no id (`NAME:IDX`) is no call in detok,
where vLLM names it after its whole header when it has no arguments, or after a `"name"` key of its arguments (the
outputs here give such a header arguments without one); and vLLM's engine coerces argument values to the types of
the tool's parameter schema (the tools here have none)."""

from __future__ import annotations

import random

from helpers.fixtures import load_fixture_tokenizer
from helpers.parse_cases import parse_in_pieces, random_cuts, whole_calls
from helpers.vllm_parsers import Parsed, vllm_parse

from detok_worker.parse.registry import (
    AUTO,
    KIMI_ARGUMENTS_BEGIN,
    KIMI_CALL_BEGIN,
    KIMI_CALL_END,
    KIMI_CALLS_BEGIN,
    KIMI_CALLS_END,
    resolve,
)

WORDS = ["Hi.", " ok", "\n", "  ", "天气", " 😀", '{"city": "Paris"}', '{"a": [1, {"b": "}"}]}', "get_weather", "x:1"]
STRAY = [KIMI_CALL_BEGIN, KIMI_CALL_END, KIMI_CALLS_END, KIMI_ARGUMENTS_BEGIN, "<think>", "</think>", "<|tool_call_e"]
ARGUMENT_WORDS = [*WORDS, " ", "", KIMI_CALL_BEGIN, KIMI_CALLS_BEGIN, "</think>"]  # markers there are arguments
HEADERS = [
    "functions.get_weather:0", " functions.get_weather:1 ", "get_weather:2", "functions.名:3", "functions.a:b:4",
    "functions.get_weather:5 trailing",
]  # fmt: skip
NO_ID_HEADERS = ["functions.get_weather", "functions.:6", "get\nweather:7", ""]  # with arguments
REASONING = ["Let me think.", " 🤔 ", "\n", "<think>", "</think>", "  \n"]


def random_call(rng: random.Random) -> str:
    header = rng.choice(HEADERS + NO_ID_HEADERS)
    if rng.random() < 0.1:  # a header with a closing marker in it: the header runs to the arguments marker
        header += KIMI_CALL_END + KIMI_CALL_BEGIN + rng.choice(HEADERS)
    arguments = "".join(rng.choice(ARGUMENT_WORDS) for _ in range(rng.randrange(0, 3)))
    if header in NO_ID_HEADERS:
        arguments += "{}"
    return KIMI_CALL_BEGIN + header + KIMI_ARGUMENTS_BEGIN + arguments + rng.choice([KIMI_CALL_END, KIMI_CALLS_END])


def random_output(rng: random.Random) -> str:
    text = "".join(rng.choice(WORDS + STRAY) for _ in range(rng.randrange(0, 3)))
    if rng.random() < 0.2:
        return text  # no calls
    text += KIMI_CALLS_BEGIN
    for _ in range(rng.randrange(0, 4)):
        text += rng.choice(["", "", "\n", " junk ", KIMI_CALLS_END + "tail"])  # between calls: markup
        text += random_call(rng)
    cut = rng.random()
    if cut < 0.1:  # the end of the output cuts a call's arguments
        return text + KIMI_CALL_BEGIN + "functions.get_weather:9" + KIMI_ARGUMENTS_BEGIN + ' {"city": "Par'
    if cut < 0.2:  # ... or its header
        return text + KIMI_CALL_BEGIN + rng.choice(HEADERS)
    return text + rng.choice([KIMI_CALLS_END, KIMI_CALLS_END + "\nbye", "", KIMI_CALL_BEGIN])


def with_reasoning(output: str, rng: random.Random) -> str:
    """The output after a reasoning: its end marker, or the calls' opening marker that ends it too."""
    reasoning = "".join(rng.choice(REASONING) for _ in range(rng.randrange(0, 4)))
    return reasoning + ("" if output.startswith(KIMI_CALLS_BEGIN) and rng.random() < 0.5 else "</think>") + output


def parsed(reasoning_parser: str, text: str, cuts: list[int]) -> Parsed:
    out = parse_in_pieces("kimi_k2", text, cuts, reasoning_parser)
    return out.reasoning, out.content, whole_calls(out)


def test_detoks_calls_are_vllms_in_any_pieces() -> None:
    rng = random.Random(23)
    outputs = [random_output(rng) for _ in range(100)]
    cases = [("", "kimi_k2", {}, text) for text in outputs]
    cases += [("kimi_k2", "kimi_k2", {}, with_reasoning(text, rng)) for text in outputs]
    theirs = vllm_parse("kimi-markers", cases)
    for (reasoning_parser, _, _, text), vllms in zip(cases, theirs, strict=True):
        whole = parsed(reasoning_parser, text, [])
        for _ in range(4):
            assert parsed(reasoning_parser, text, random_cuts(len(text), rng)) == whole, text
        assert whole == vllms, text
    called = [calls for _, _, calls in theirs if calls]
    assert len(called) > 80 and any(len(calls) > 2 for calls in called)


def test_auto_reads_kimis_calls_where_its_markers_are_tokens() -> None:
    """Kimi's markers name the family; Qwen3's vocabulary (no such markers) stays hermes."""
    assert resolve(AUTO, load_fixture_tokenizer("kimi-markers").token_to_id, tools=True) == "kimi_k2"
    assert resolve(AUTO, load_fixture_tokenizer("qwen3").token_to_id, tools=True) == "hermes"


def test_each_call_carries_the_id_its_header_starts_with_on_its_first_piece() -> None:
    """vLLM's id of a call: its header's first line up to the last `:` and digits, trimmed (the name before the
    first `:`); any cut gives it on the call's first piece only."""
    headers = {
        "functions.get_weather:0": "functions.get_weather:0",
        " functions.get_weather:1 ": "functions.get_weather:1",
        "get_weather:2": "get_weather:2",
        "functions.a:b:4": "functions.a:b:4",
        "functions.get_weather:5 trailing": "functions.get_weather:5",
    }
    text = KIMI_CALLS_BEGIN + "".join(
        KIMI_CALL_BEGIN + header + KIMI_ARGUMENTS_BEGIN + '{"x": 1}' + KIMI_CALL_END for header in headers
    )
    text += KIMI_CALL_BEGIN + "functions.cut:6"  # a header the end of the output cuts off still has its id
    rng = random.Random(5)
    for cuts in [[], *(random_cuts(len(text), rng) for _ in range(20))]:
        out = parse_in_pieces("kimi_k2", text, cuts)
        assert [piece.id for piece in out.tool_calls if piece.name] == [*headers.values(), "functions.cut:6"]
        assert all(not piece.id for piece in out.tool_calls if not piece.name), "the id comes with the name only"
