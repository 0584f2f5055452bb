"""Recorded-style model outputs of each family (as their chat templates render them), and a driver that streams
their ids through a real WorkerState and reassembles the channels the way the front does."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import DetokParams, Open, RequestParams, TextDelta, Tokens
from detok_worker.bus.reassembly import DeltaReassembly, ParsedReassembly
from detok_worker.parse.base import ParsedOutput
from detok_worker.parse.registry import SCHEMA_TOOL_CALL_PARSERS, create_parser
from detok_worker.parse.tool_types import parameter_types
from detok_worker.trace.format import TraceWriter, make_header
from detok_worker.worker.state import WorkerState
from helpers.fixtures import load_fixture_tokenizer


@dataclass(frozen=True)
class OutputCase:
    name: str
    tokenizer: str
    prompt_tail: str  # the end of the rendered prompt
    output: str  # what the model wrote, special tokens included, up to its stop token
    stop_token: str  # the token the model ends with (EOS / <|call|>)
    reasoning_parser: str
    tool_call_parser: str
    reasoning: str
    content: str
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments)
    stop: tuple[str, ...] = ()
    finish: str = "stop"
    stop_reason: str | None = None
    skip_special_tokens: bool = True
    tool_call_ids: tuple[str, ...] = ()  # the calls' ids as the model wrote them (none: the front makes them)


# the tools every recorded case's request offers (the XML-parameter families type the arguments by them)
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}
    for name, properties in (
        ("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}),
        ("get_time", {"tz": {"type": "string"}}),
        ("time", {}),
    )
]
QWEN_TOOL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
CASES = [
    OutputCase(
        "qwen3-think-tool", "qwen3", "<|im_start|>assistant\n",
        "<think>\nThe user wants the weather in Paris. I should call get_weather.\n</think>\n\n"
        f"<tool_call>\n{QWEN_TOOL}\n</tool_call>",
        "<|im_end|>", "qwen3", "hermes",
        reasoning="\nThe user wants the weather in Paris. I should call get_weather.\n", content="\n\n",
        tool_calls=[("get_weather", '{"city": "Paris", "unit": "celsius"}')],
    ),
    OutputCase(
        "qwen3-two-tools-and-text", "qwen3", "<|im_start|>assistant\n",
        '<think>\n\n</think>\n\nChecking both.<tool_call>\n{"name": "a", "arguments": {"x": [1, {"y": "}"}]}}\n'
        '</tool_call>\n<tool_call>\n{"arguments": {"q": "caf\\u00e9 \\"x\\""}, "name": "search"}\n</tool_call>',
        "<|im_end|>", "qwen3", "hermes", reasoning="\n\n", content="\n\nChecking both.\n",
        tool_calls=[("a", '{"x": [1, {"y": "}"}]}'), ("search", '{"q": "caf\\u00e9 \\"x\\""}')],
    ),
    OutputCase(
        "qwen3-enable-thinking-false", "qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        "Paris is the capital of France; <think> here is just text.", "<|im_end|>", "qwen3", "",
        reasoning="", content="Paris is the capital of France; <think> here is just text.",
    ),
    OutputCase(
        "qwen3-prefilled-think", "qwen3", "<|im_start|>assistant\n<think>\n",
        "2 + 2: add them, 4.\n</think>\n\nThe answer is 4.", "<|im_end|>", "qwen3", "",
        reasoning="2 + 2: add them, 4.\n", content="\n\nThe answer is 4.",
    ),
    OutputCase(
        "qwen3-stop-in-content-only", "qwen3", "<|im_start|>assistant\n",
        "<think>\nParis? Yes, Paris.\n</think>\n\nThe capital is Paris. Anything else?", "<|im_end|>", "qwen3", "",
        reasoning="\nParis? Yes, Paris.\n", content="\n\nThe capital is ", stop=("Paris",), stop_reason="Paris",
    ),
    OutputCase(
        "deepseek-r1", "deepseek-v3", "<｜Assistant｜><think>\n",
        "Okay, compare 9.11 and 9.8: 0.8 > 0.11.\n</think>\n\n9.8 is greater.", "<｜end▁of▁sentence｜>",
        "deepseek_r1", "", reasoning="Okay, compare 9.11 and 9.8: 0.8 > 0.11.\n", content="\n\n9.8 is greater.",
    ),
    OutputCase(
        "deepseek-r1-repeats-think", "deepseek-v3", "<｜Assistant｜>",
        "<think>\nHmm.\n</think>\n\nHello!", "<｜end▁of▁sentence｜>", "deepseek_r1", "",
        reasoning="\nHmm.\n", content="\n\nHello!",
    ),
    OutputCase(
        "gpt-oss-final", "gpt-oss", "<|start|>assistant",
        "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|><|start|>assistant<|channel|>final"
        "<|message|>2 + 2 = 4.", "<|return|>", "gpt_oss", "", reasoning="User asks 2+2. Simple.",
        content="2 + 2 = 4.", skip_special_tokens=False,
    ),
    OutputCase(
        "gpt-oss-tool", "gpt-oss", "<|start|>assistant",
        "<|channel|>analysis<|message|>Need weather; call the tool.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco, CA"}', "<|call|>",
        "gpt_oss", "gpt_oss", reasoning="Need weather; call the tool.", content="",
        tool_calls=[("get_weather", '{"location":"San Francisco, CA"}')], skip_special_tokens=False,
    ),
    OutputCase(
        "gpt-oss-preamble-tool", "gpt-oss", "<|start|>assistant",
        "<|channel|>analysis<|message|>Weather needs the tool.<|end|><|start|>assistant<|channel|>commentary"
        "<|message|>Checking the forecast.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
        ' <|constrain|>json<|message|>{"location":"Paris"}', "<|call|>", "gpt_oss", "gpt_oss",
        reasoning="Weather needs the tool.", content="Checking the forecast.",
        tool_calls=[("get_weather", '{"location":"Paris"}')], skip_special_tokens=False,
    ),
    OutputCase(
        "llama3-json", "deepseek-v3", "assistant<|end_header_id|>\n\n",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "time", "parameters": {}}',
        "<｜end▁of▁sentence｜>", "", "llama3_json", reasoning="", content="",
        tool_calls=[("get_weather", '{"city": "Paris"}'), ("time", "{}")],
    ),
    OutputCase(  # mistral-common tokenizer v11+ (Mistral Small 3.2, Magistral, Devstral): name, then [ARGS]
        "mistral-v11", "mistral-sp-v1", "[/INST]",
        'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e'
        '[ARGS]{"tz": "CET"}', "</s>", "", "mistral", reasoning="", content=" Let me check.",
        tool_calls=[("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET"}')],
    ),
    OutputCase(  # DeepSeek-V3.1 (its tokenizer is V3's: the markers are special tokens)
        "deepseek-v31-tools", "deepseek-v3", "<｜Assistant｜></think>",
        'Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "巴黎 ☀️"}'
        '<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
        "<｜end▁of▁sentence｜>", "", "deepseek_v31", reasoning="", content="Let me check.",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️"}'), ("get_time", '{"tz": "CET"}')],
    ),
    OutputCase(  # Kimi-K2 (no Kimi tokenizer offline: the DeepSeek-V3 fixture with its markers as special tokens)
        "kimi-k2-think-tools", "kimi-markers", "<|im_assistant|>assistant<|im_middle|>",
        "<think>Weather and time: two calls.\n\n</think>Let me check.<|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "巴黎 ☀️"}<|tool_call_end|><|tool_call_begin|>'
        'functions.get_time:1<|tool_call_argument_begin|> {"tz": "CET"} <|tool_call_end|><|tool_calls_section_end|>',
        "<|im_end|>", "kimi_k2", "kimi_k2", reasoning="Weather and time: two calls.", content="Let me check.",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️"}'), ("get_time", '{"tz": "CET"}')], skip_special_tokens=False,
        tool_call_ids=("functions.get_weather:0", "functions.get_time:1"),
    ),
    OutputCase(  # Qwen3-Coder: the embedded Qwen3 vocabulary is its own (<tool_call> a token, <function= text)
        "qwen3-coder-tools", "qwen3", "<|im_start|>assistant\n",
        "I'll check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n巴黎 ☀️ <b>\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
        "<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>",
        "<|im_end|>", "", "qwen3_coder", reasoning="", content="I'll check both.",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️ <b>", "days": 3}'), ("get_time", '{"tz": "CET"}')],
    ),
    OutputCase(  # GLM-4.5 to 4.7 (no GLM tokenizer offline: DeepSeek-V3's with GLM's markers as special tokens)
        "glm47-tools", "glm-markers", "<|assistant|>",
        "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>巴黎 ☀️</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>tz</arg_key>"
        "\n<arg_value>CET</arg_value>\n</tool_call>",
        "<|user|>", "", "glm47", reasoning="", content="Let me check.",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️", "days": 3}'), ("get_time", '{"tz": "CET"}')],
        skip_special_tokens=False,
    ),
    OutputCase(  # MiniMax-M2 (no MiniMax tokenizer offline: the DeepSeek-V3 fixture with its markers as special tokens)
        "minimax-m2-tools", "minimax-markers", "]~b]ai\n",
        'Checking.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">巴黎 ☀️</parameter>\n'
        '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="tz">CET'
        "</parameter>\n</invoke>\n</minimax:tool_call>",
        "[e~[", "", "minimax_m2", reasoning="", content="Checking.",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️", "days": 3}'), ("get_time", '{"tz": "CET"}')],
        skip_special_tokens=False,
    ),
    OutputCase(  # DeepSeek-V3.2's DSML calls: its vocabulary is V3's, where the DSML markers are text, not tokens; the
        # `string` attribute says which values are text, the schema types the others; the content keeps its end
        "deepseek-v32-tools", "deepseek-v3", "<｜Assistant｜>",
        "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        '<｜DSML｜parameter name="city" string="true">巴黎 ☀️</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        '<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="tz" string="true">CET</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        "<｜end▁of▁sentence｜>", "", "deepseek_v32", reasoning="", content="Checking.\n\n",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️", "days": 3}'), ("get_time", '{"tz": "CET"}')],
    ),
    OutputCase(  # GLM-4.5: the output opens the think block itself; reasoning and tool calls both read
        "glm45-think-tools", "glm-markers", "<|assistant|>",
        "<think>The user wants the weather: one call.\n</think>Let me check.\n<tool_call>get_weather\n"
        "<arg_key>city</arg_key>\n<arg_value>巴黎 ☀️</arg_value>\n</tool_call>",
        "<|user|>", "glm45", "glm45", reasoning="The user wants the weather: one call.", content="Let me check.",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️"}')], skip_special_tokens=False,
    ),
    OutputCase(  # MiniMax-M2: its template opens the think block, the output only closes it
        "minimax-m2-think-tools", "minimax-markers", "]~b]ai\n<think>\n",
        "The user wants the weather.\n</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
        '<parameter name="city">巴黎 ☀️</parameter>\n</invoke>\n</minimax:tool_call>',
        "[e~[", "minimax_m2", "minimax_m2", reasoning="The user wants the weather.", content="",
        tool_calls=[("get_weather", '{"city": "巴黎 ☀️"}')], skip_special_tokens=False,
    ),
    OutputCase(  # MiniMax-M2 as vLLM's minimax_m2_append_think gives it: all content, the block's start put back (on
        # Qwen3, whose </think> is no special token: the parser leaves skip_special_tokens to the request, as vLLM's)
        "minimax-m2-append-think", "qwen3", "<|im_start|>assistant\n<think>\n",
        "The user greets me; reply briefly.\n</think>\n\nHello! How can I help?", "<|im_end|>",
        "minimax_m2_append_think", "", reasoning="",
        content="<think>The user greets me; reply briefly.\n</think>\n\nHello! How can I help?",
    ),
    OutputCase(  # Olmo 3 Think (its markers are text, as on the DeepSeek-V3 fixture): its template opens the block
        "olmo3-think", "deepseek-v3", "<|im_start|>assistant\n<think>",
        "Compare 9.11 and 9.8: 0.8 > 0.11.</think>9.8 is greater.", "<｜end▁of▁sentence｜>", "olmo3", "",
        reasoning="Compare 9.11 and 9.8: 0.8 > 0.11.", content="9.8 is greater.",
    ),
    OutputCase(  # Granite 3.2 (its phrases are plain text): thinking asked for by its template
        "granite-think", "deepseek-v3", "<|start_of_role|>assistant<|end_of_role|>",
        "Here is my thought process:\nThe user asks 2 + 2.\nHere's my response:\n2 + 2 = 4.",
        "<｜end▁of▁sentence｜>", "granite", "", reasoning="\nThe user asks 2 + 2.\n", content="\n2 + 2 = 4.",
    ),
    OutputCase(
        "mistral", "mistral-sp-v1", "[/INST]",
        'Let me check. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"tz": "CET"}}]', "</s>", "", "mistral",
        reasoning="", content=" Let me check. ",  # the SentencePiece space after [/INST]
        tool_calls=[("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET"}')],
    ),
]  # fmt: skip


def case_ids(tokenizer: Any, case: OutputCase) -> tuple[list[int], list[int]]:
    """(prompt tail ids, output ids ending with the stop token)."""
    stop_id = tokenizer.token_to_id(case.stop_token)
    assert stop_id is not None
    return tokenizer.encode(case.prompt_tail).ids, [*tokenizer.encode(case.output).ids, stop_id]


def write_case_trace(path: Path, case: OutputCase) -> Path:
    """A one-request trace whose output is `case`'s (a `--source trace` service replays it for any request)."""
    tokenizer = load_fixture_tokenizer(case.tokenizer)
    tail, ids = case_ids(tokenizer, case)
    with TraceWriter(path, make_header(tokenizer, "test")) as writer:
        writer.request("rec-1", tail, RequestParams(max_tokens=200), t_ns=0)
        writer.tokens("rec-1", ids, "stop", t_ns=1)
    return path


def params_of(tokenizer: Any, case: OutputCase) -> DetokParams:
    stop_ids = sorted({*tokenizer.eos_token_ids, tokenizer.token_to_id(case.stop_token)})
    return DetokParams(
        stop=list(case.stop),
        stop_token_ids=stop_ids,
        skip_special_tokens=case.skip_special_tokens,
        reasoning_parser=case.reasoning_parser,
        tool_call_parser=case.tool_call_parser,
        tool_parameter_types=tool_types_of(case),
    )


def tool_types_of(case: OutputCase) -> str:
    """What the front gives the worker of the request's TOOLS for the case's parser."""
    return parameter_types(TOOLS) if case.tool_call_parser in SCHEMA_TOOL_CALL_PARSERS else ""


def whole_parse(tokenizer: Any, case: OutputCase) -> ParsedOutput:
    """The parser on the full decode, in one piece (no stop strings: cases with stops check the expected split)."""
    tail, ids = case_ids(tokenizer, case)
    parser = create_parser(
        case.reasoning_parser,
        case.tool_call_parser,
        tokenizer.decode(tail, skip_special_tokens=False),
        tool_types=tool_types_of(case),
    )
    assert parser is not None
    skip = case.skip_special_tokens
    text = tokenizer.decode(tail + ids[:-1], skip_special_tokens=skip)[
        len(tokenizer.decode(tail, skip_special_tokens=skip)) :
    ]
    out = parser.feed(text)
    out.extend(parser.finish())
    return out


def parse_in_pieces(tool_call_parser: str, text: str, cuts: list[int], reasoning_parser: str = "") -> ParsedOutput:
    """A tool-call parser (and a reasoning parser) fed `text` cut at `cuts` (character offsets), then finished."""
    parser = create_parser(reasoning_parser, tool_call_parser)
    assert parser is not None
    out = ParsedOutput()
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        out.extend(parser.feed(text[start:end]))
    out.extend(parser.finish())
    return out


def parse_every_way(tool_call_parser: str, text: str) -> ParsedOutput:
    """`text` parsed whole, after asserting that every cut (character by character, and each single cut) gives the
    same channels."""
    whole = parse_in_pieces(tool_call_parser, text, [])
    assert parse_in_pieces(tool_call_parser, text, list(range(1, len(text)))) == whole
    for cut in range(1, len(text)):
        assert parse_in_pieces(tool_call_parser, text, [cut]) == whole
    return whole


def calls_of(out: ParsedOutput) -> list[tuple[str, str]]:
    return [(piece.name, piece.arguments) for piece in out.tool_calls]


def whole_calls(out: ParsedOutput) -> list[tuple[str, str]]:
    """Each call's name and arguments, its pieces joined."""
    calls: dict[int, tuple[str, str]] = {}
    for piece in out.tool_calls:
        name, arguments = calls.get(piece.index, ("", ""))
        calls[piece.index] = (name + piece.name, arguments + piece.arguments)
    return [calls[index] for index in sorted(calls)]


def random_cuts(length: int, rng: random.Random) -> list[int]:
    """Cut offsets splitting a text of `length` characters into pieces of 1 to 5."""
    cuts, at = [], rng.randrange(1, 6)
    while at < length:
        cuts.append(at)
        at += rng.randrange(1, 6)
    return cuts


@dataclass
class Received:
    """What a front makes of a rid's deltas: each channel once (bus/reassembly.py), and the pieces as streamed."""

    raw: DeltaReassembly = field(default_factory=DeltaReassembly)
    parsed: ParsedReassembly = field(default_factory=ParsedReassembly)
    total: ParsedOutput = field(default_factory=ParsedOutput)
    pieces: list[ParsedOutput] = field(default_factory=list)
    last: TextDelta | None = None

    def take(self, deltas: list[TextDelta]) -> None:
        for delta in deltas:
            assert self.raw.take(delta) is not None
            assert delta.parsed is not None
            fresh = self.parsed.take(delta.parsed)
            assert fresh is not None, "a gap in a parsed channel"
            piece = ParsedOutput(fresh.content, fresh.reasoning)
            for call in fresh.tool_calls:
                piece.add_tool(call.index, call.name, call.arguments, call.id)
            self.pieces.append(piece)
            self.total.extend(piece)
            if delta.finish is not None:
                self.last = delta


def random_splits(count: int, rng: random.Random) -> list[int]:
    """Batch sizes summing to `count`."""
    sizes = []
    while count:
        size = min(count, rng.choice([1, 1, 2, 3, 5, 8]))
        sizes.append(size)
        count -= size
    return sizes


def stream_case(
    tokenizer: Any, case: OutputCase, sizes: list[int], *, reopen_after: int | None = None, rid: str = "r1"
) -> Received:
    """Stream the case's output ids through a WorkerState in batches of `sizes`; with `reopen_after`, the worker
    is lost after that many batches and a fresh one gets the rid again with its whole history."""
    tail, ids = case_ids(tokenizer, case)
    params = params_of(tokenizer, case)
    received = Received()
    worker = WorkerState(tokenizer, "w0")
    start = 0
    for step, size in enumerate(sizes):
        chunk = ids[start : start + size]
        first = step == 0
        if reopen_after is not None and step == reopen_after:
            worker = WorkerState(tokenizer, "w1")
            chunk, first = ids[: start + size], True
        finish = "stop" if start + size >= len(ids) else None
        opens = [Open(rid, tail, params)] if first else []
        result = worker.handle_batch(token_batch(step, 0, opens, [(rid, Tokens(chunk, finish))]))
        received.take(text_deltas(result.text_batch))
        start += size
        if received.last is not None:
            break
    return received
