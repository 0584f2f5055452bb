"""Parsers by name, the parser of one request, and the choice by model family (`auto`).

A request names at most one reasoning parser and one tool-call parser (DetokParams.reasoning_parser /
tool_call_parser). Its OutputParser chains them: the reasoning stage's content is the tool stage's input.
Harmony (gpt-oss) does both in one stage, since its channels carry both. A chat `tool_choice` that forces calls
("required", or a named function) replaces the tool-call parser with the stage for that output (REQUIRED_CALLS,
NAMED_CALL); those two are not parsers a configuration names. The XML-parameter families (SCHEMA_TOOL_CALL_PARSERS)
type their arguments by the request's tools (DetokParams.tool_parameter_types).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from detok_worker.parse.base import OutputParser, TextStage
from detok_worker.parse.harmony import HarmonyStage
from detok_worker.parse.reasoning import (
    THINK_END,
    THINK_START,
    CountedMarkers,
    PrefixedContent,
    ReasoningTokenCount,
    ThinkStage,
    ThinkState,
    initial_state,
)
from detok_worker.parse.tool_calls import (
    DelimitedCalls,
    Llama3JsonCalls,
    MistralCalls,
    NamedCall,
    RequiredCalls,
    TaggedJsonCalls,
    kimi_call_name,
)
from detok_worker.parse.tool_types import ToolTypes
from detok_worker.parse.xml_calls import DEEPSEEK_V32, GLM47, MINIMAX_M2, QWEN3_CODER, XmlCalls

AUTO = "auto"
HARMONY = "gpt_oss"
REQUIRED_CALLS = "tool_choice_required"  # the output is a JSON array of calls
NAMED_CALL = "tool_choice_function"  # the output is the arguments of DetokParams.tool_function
# Kimi-K2's tool-call markers (special tokens)
KIMI_CALLS_BEGIN, KIMI_CALLS_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN, KIMI_CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
KIMI_ARGUMENTS_BEGIN = "<|tool_call_argument_begin|>"
# hermes' tool-call markers, which Qwen, Qwen3 and GLM write too
TOOL_CALL_BEGIN, TOOL_CALL_END = "<tool_call>", "</tool_call>"
MINIMAX_CALLS_BEGIN, MINIMAX_CALLS_END = "<minimax:tool_call>", "</minimax:tool_call>"
# Granite's reasoning starts and ends with a phrase, each in two spellings
GRANITE_REASONING_START = ("Here is my thought process:", "Here's my thought process:")
GRANITE_REASONING_END = ("Here is my response:", "Here's my response:")

# name -> stage factory taking the decoded end of the prompt
REASONING_PARSERS: dict[str, Callable[[str], TextStage]] = {
    "qwen3": lambda prompt_tail: ThinkStage(initial_state(prompt_tail, ThinkState.OPENING_TO_CONTENT)),
    "deepseek_r1": lambda prompt_tail: ThinkStage(initial_state(prompt_tail, ThinkState.OPENING_TO_REASONING)),
    # vLLM 0.32's qwen3 parser does not read the prompt: it reasons from the start unless thinking is off, when
    # the front does not name it (THINKING_SWITCHED); a tool call ends the reasoning (its parser engine's rule)
    "qwen3_vllm": lambda prompt_tail: ThinkStage(
        ThinkState.OPENING_TO_REASONING, absorb=True, implicit_ends=(TOOL_CALL_BEGIN,)
    ),
    HARMONY: lambda prompt_tail: HarmonyStage(tools=False),
    # vLLM 0.32's parsers of these families read no prompt either (the first three: its parser engine's rules)
    "glm45": lambda prompt_tail: ThinkStage(
        ThinkState.OPENING_TO_REASONING, absorb=True, reopen=True, implicit_ends=(TOOL_CALL_BEGIN,), trim=True
    ),
    "kimi_k2": lambda prompt_tail: ThinkStage(
        ThinkState.OPENING_TO_REASONING, absorb=True, implicit_ends=(KIMI_CALLS_BEGIN,), trim=True
    ),
    "minimax_m2": lambda prompt_tail: ThinkStage(
        ThinkState.OPENING_TO_REASONING, absorb=True, implicit_ends=(MINIMAX_CALLS_BEGIN,), trim=True
    ),
    "minimax_m2_append_think": lambda prompt_tail: PrefixedContent(THINK_START),
    "olmo3": lambda prompt_tail: ThinkStage(ThinkState.OPENING_TO_REASONING),
    "granite": lambda prompt_tail: ThinkStage(
        ThinkState.OPENING_TO_CONTENT, GRANITE_REASONING_START, GRANITE_REASONING_END
    ),
}
# vLLM's deepseek_v3 is its deepseek_r1 while thinking is on, else none (THINKING_SWITCHED)
REASONING_PARSERS["deepseek_v3"] = REASONING_PARSERS["deepseek_r1"]
# the reasoning parsers whose reasoning tokens are counted as vLLM's parser of that family counts them -> the marker
# tokens it counts by (ReasoningTokenCount); None: vLLM's parser counts none (0)
COUNTED_REASONING: dict[str, CountedMarkers | None] = {
    "qwen3_vllm": CountedMarkers(ends=(THINK_END, TOOL_CALL_BEGIN), aside=(TOOL_CALL_END,)),
    "deepseek_r1": CountedMarkers(pairs=True),
    "glm45": CountedMarkers(tool_call=(TOOL_CALL_BEGIN, TOOL_CALL_END)),
    "kimi_k2": CountedMarkers(
        ends=(THINK_END, KIMI_CALLS_BEGIN), aside=(KIMI_CALLS_END, KIMI_CALL_BEGIN, KIMI_ARGUMENTS_BEGIN, KIMI_CALL_END)
    ),
    "minimax_m2": CountedMarkers(ends=(THINK_END, MINIMAX_CALLS_BEGIN), aside=(MINIMAX_CALLS_END,)),
    "minimax_m2_append_think": None,
    "olmo3": None,
    "granite": None,
}
COUNTED_REASONING["deepseek_v3"] = COUNTED_REASONING["deepseek_r1"]


def _thinking_or_enable_thinking(template_kwargs: Mapping[str, Any]) -> bool:
    """vLLM's glm45 and kimi_k2: thinking unless `thinking` or `enable_thinking` is given, and then if one is true."""
    given = [template_kwargs.get(key) for key in ("thinking", "enable_thinking")]
    return all(value is None for value in given) or any(bool(value) for value in given)


# reasoning parsers that a chat's template arguments turn off (vLLM's parser of that family reads them from the
# request's chat_template_kwargs) -> whether the arguments leave thinking on; with thinking off the whole output is
# content
THINKING_SWITCHED: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    # vLLM's qwen3: thinking unless `enable_thinking` is given and false
    "qwen3_vllm": lambda kwargs: bool(kwargs.get("enable_thinking", True)),
    "glm45": _thinking_or_enable_thinking,
    "kimi_k2": _thinking_or_enable_thinking,
    # vLLM's deepseek_v3: thinking only when `thinking` or `enable_thinking` is true
    "deepseek_v3": lambda kwargs: bool(kwargs.get("thinking")) or bool(kwargs.get("enable_thinking")),
}
TOOL_CALL_PARSERS: dict[str, Callable[[], TextStage]] = {
    "hermes": lambda: TaggedJsonCalls(TOOL_CALL_BEGIN, TOOL_CALL_END),
    "qwen": lambda: TaggedJsonCalls(TOOL_CALL_BEGIN, TOOL_CALL_END),
    "llama3_json": Llama3JsonCalls,
    "mistral": MistralCalls,
    "deepseek_v31": lambda: DelimitedCalls(
        "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
    ),
    HARMONY: lambda: HarmonyStage(reasoning=False),
    "kimi_k2": lambda: DelimitedCalls(
        KIMI_CALLS_BEGIN,
        KIMI_CALL_BEGIN,
        KIMI_ARGUMENTS_BEGIN,
        KIMI_CALL_END,
        calls_end=KIMI_CALLS_END,
        call_name=kimi_call_name,
    ),
}
# tool-call parsers that read the request's tools (the names a call may take, its parameters' types): name -> stage
SCHEMA_TOOL_CALL_PARSERS: dict[str, Callable[[ToolTypes], TextStage]] = {
    "qwen3_coder": lambda tools: XmlCalls(QWEN3_CODER, tools),
    "glm45": lambda tools: XmlCalls(GLM47, tools),  # vLLM 0.32 reads GLM-4.5 to 4.7 with one parser
    "glm47": lambda tools: XmlCalls(GLM47, tools),
    "minimax_m2": lambda tools: XmlCalls(MINIMAX_M2, tools),
    "deepseek_v32": lambda tools: XmlCalls(DEEPSEEK_V32, tools),
}
# Parsers whose markers are special tokens: the worker must decode them (skip_special_tokens false), as vLLM does.
# vLLM's parser-engine families (glm45, kimi_k2, minimax_m2, deepseek_v32) always decode them so.
NEEDS_SPECIAL_TOKENS = frozenset(
    {HARMONY, "mistral", "llama3_json", "deepseek_v31", "glm45", "glm47", "minimax_m2", "kimi_k2", "deepseek_v32"}
)

# family markers (tokens of the vocabulary) -> parser, in order; the first family found wins
_REASONING_FAMILIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>", "<|message|>"), HARMONY),
    (("<think>", "</think>", "<|im_start|>"), "qwen3"),
    (("<think>", "</think>", "<｜Assistant｜>"), "deepseek_r1"),
)
_TOOL_FAMILIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>", "<|message|>"), HARMONY),
    ((KIMI_CALLS_BEGIN, KIMI_CALL_BEGIN), "kimi_k2"),  # Kimi's own markers: before any its vocabulary may share
    (("<tool_call>", "<arg_key>", "<arg_value>"), "glm47"),  # before hermes: GLM's vocabulary has <tool_call> too
    (("<minimax:tool_call>", "</minimax:tool_call>"), "minimax_m2"),
    (("<tool_call>", "</tool_call>"), "hermes"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<|python_tag|>",), "llama3_json"),
)


class ParserError(ValueError):
    pass


def check_names(reasoning: str, tool_calls: str) -> None:
    """Raise ParserError for a name no parser has ("" means none)."""
    if reasoning and reasoning not in REASONING_PARSERS:
        raise ParserError(f"unknown reasoning parser {reasoning!r}; known: {', '.join(sorted(REASONING_PARSERS))}")
    known = TOOL_CALL_PARSERS.keys() | SCHEMA_TOOL_CALL_PARSERS.keys()
    if tool_calls and tool_calls not in known and tool_calls not in (REQUIRED_CALLS, NAMED_CALL):
        raise ParserError(f"unknown tool-call parser {tool_calls!r}; known: {', '.join(sorted(known))}")


def family_parser(token_to_id: Callable[[str], int | None], families: Sequence[tuple[tuple[str, ...], str]]) -> str:
    """The parser of the first family whose marker tokens are all in the vocabulary, or "" (none)."""
    for tokens, name in families:
        if all(token_to_id(token) is not None for token in tokens):
            return name
    return ""


def resolve(configured: str, token_to_id: Callable[[str], int | None], *, tools: bool) -> str:
    """A configured name as is ("" or "none" = no parser); "auto" = by the tokenizer's family."""
    if configured == AUTO:
        return family_parser(token_to_id, _TOOL_FAMILIES if tools else _REASONING_FAMILIES)
    return "" if configured == "none" else configured


def create_parser(
    reasoning: str, tool_calls: str, prompt_tail_text: str = "", tool_function: str = "", tool_types: str = ""
) -> OutputParser | None:
    """The parser of one request (None when it names none); `tool_function`: the function of NAMED_CALL;
    `tool_types`: the request's tools for SCHEMA_TOOL_CALL_PARSERS (tool_types.parameter_types). Raises ParserError
    for an unknown name or tool types that do not decode."""
    check_names(reasoning, tool_calls)
    if reasoning == HARMONY or tool_calls == HARMONY:
        return OutputParser([HarmonyStage(reasoning=reasoning == HARMONY, tools=tool_calls == HARMONY)])
    stages: list[TextStage] = []
    if reasoning:
        stages.append(REASONING_PARSERS[reasoning](prompt_tail_text))
    if tool_calls == REQUIRED_CALLS:
        stages.append(RequiredCalls())
    elif tool_calls == NAMED_CALL:
        stages.append(NamedCall(tool_function))
    elif tool_calls in SCHEMA_TOOL_CALL_PARSERS:
        try:
            tools = ToolTypes.from_json(tool_types)
        except ValueError as exc:
            raise ParserError(str(exc)) from exc
        stages.append(SCHEMA_TOOL_CALL_PARSERS[tool_calls](tools))
    elif tool_calls:
        stages.append(TOOL_CALL_PARSERS[tool_calls]())
    return OutputParser(stages) if stages else None


def reasoning_token_count(reasoning: str, token_to_id: Callable[[str], int | None]) -> ReasoningTokenCount | None:
    """The count of a request's reasoning tokens, for a parser in COUNTED_REASONING that counts by markers, when
    they are all tokens of the tokenizer; else None (none counted)."""
    markers = COUNTED_REASONING.get(reasoning)
    if markers is None:
        return None
    marked = (markers.start, *markers.ends, *(markers.tool_call or ()), *markers.aside)
    ids = {marker: token_id for marker in marked if (token_id := token_to_id(marker)) is not None}
    return ReasoningTokenCount(markers, ids) if len(ids) == len(set(marked)) else None
