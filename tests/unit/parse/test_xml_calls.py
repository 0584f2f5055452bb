"""The XML-parameter tool calls (`--tool-call-parser qwen3_coder`, `glm45` / `glm47`, `minimax_m2`, `deepseek_v32`):
random outputs of each family (calls with typed and string parameters, text, CJK and emoji, stray markup, calls
that are none, calls cut off by the end of the output), parsed by detok in random pieces and whole, and by vLLM
0.32's own parser of the family (in vLLM's virtualenv, one subprocess for every case of the module) on the whole
text with the same tools: the same content and calls, arguments to the character.

vLLM reads the text only (no token ids), as detok does: its tokenizer matters only for the special tokens it would
drop, and these outputs have none, so the embedded Qwen3 tokenizer serves the four parsers. They run as vLLM's
server runs them without a reasoning parser (reasoning markers are text).

The differences kept, each where vLLM's streaming already sent what detok sends:
- a string value whose closing tag never comes (the output cut off inside it) is kept as streamed, closed; vLLM's
  whole parse drops the parameter;
- whitespace before the content's first text stays when calls come after that text; vLLM's whole parse strips it;
- a parameter named twice is written twice (the parsed object is vLLM's: the last value).
DSML values (deepseek_v32) carry a random `string` attribute (or none) whatever the schema says; they avoid values
that parse to a JSON infinity (vLLM writes `Infinity`, no JSON; detok the text as a string).
The outputs avoid the one other difference (content between a call that is none and a later call that stands: vLLM
drops it, detok has sent it)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from helpers.parse_cases import CASES, calls_of, random_splits
from helpers.parse_cases import TOOLS as CASE_TOOLS
from helpers.tokenizer_files import fixture_tokenizer_json
from helpers.vllm_cpu import run_vllm_script

from detok_worker.parse.base import ParsedOutput
from detok_worker.parse.registry import SCHEMA_TOOL_CALL_PARSERS, ParserError, create_parser, resolve
from detok_worker.parse.tool_types import parameter_types

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}
    for name, properties in (
        ("get_weather", {
            "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
            "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
            "when": {"type": ["string", "null"]}, "unit": {"enum": ["c", "f", 1]},
            "any": {"anyOf": [{"type": "integer"}, {"type": "String"}]}, "raw": {}, "size": {"type": "int64"},
            "flag": {"type": "Bool"},
        }),
        ("search", {"q": {"type": "string"}}),
        ("ping", {}),
    )
]  # fmt: skip
VALUES = {
    "city": ["Paris", "巴黎 ☀️", "a < b > c", "x<y", '"quoted" \\ back', "line\nbreak", "", "</para", "\nlead"],
    "days": ["3", " 4 ", "-2", "abc", "[1]", "1.5"],
    "temp": ["1.50", "2", "1e3", "nan", "-0.0", "warm"],
    "metric": ["true", "False", "1", "0", "yes"],
    "opts": ['{"a": [1, 2]}', "{bad", "[1e999]", '"s"'],
    "tags": ['["a", "b"]', "[]", "a,b"],
    "when": ["null", "NULL", "tomorrow"],
    "unit": ["c", "1", "f"],
    "any": ["7", "seven"],
    "raw": ['{"k": 1}', "text"],
    "size": ["10", "1_0", "ten"],
    "flag": ["True", "0", "no"],
    "q": ["weather 天气", "😀", "1 > 0"],
    "extra": ["1", "plain", "{}"],
}
WORDS = ["Hi.", " ok", "\n", "  ", "天气", " 😀", "x", "a > b", "<b>", "</p>"]
# stray markup in content that starts no call (a closing marker of the calls is markup there in minimax)
STRAYS = {
    "qwen3_coder": ["</tool_call>", "</function>", "<parameter=a>", "</parameter>", ">", "</think>", "<tool_"],
    "glm47": ["</tool_call>", "<arg_key>", "</arg_value>", "<think>", "<tool"],
    "minimax_m2": ["</invoke>", '<parameter name="a">', "</parameter>", '">', "</minimax:tool_call>", "<minimax:"],
    "deepseek_v32": ["</｜DSML｜invoke>", '<｜DSML｜parameter name="a">', "</｜DSML｜parameter>", '">', "<｜DSML｜"],
}
NAMES = ["get_weather", "search", "ping", "nope", " get_weather ", ""]
PARTIAL = "巴黎 Pa"  # a string value cut off by the end of the output


@dataclass
class Output:
    family: str
    text: str
    tools: list[dict[str, Any]] | None
    cut: tuple[str, str] | None = None  # (key, text) of a string value the end of the output cut off


def qwen3_call(rng: random.Random, name: str, params: list[tuple[str, str]], cut: str) -> str:
    body = "".join(f"<parameter={rng.choice(['', ' '])}{key}>\n{value}\n</parameter>\n" for key, value in params)
    if cut:
        return f"<tool_call>\n<function={name}>\n{body}{cut}"
    call = f"<function={name}>\n{body}</function>"
    return rng.choice([f"<tool_call>\n{call}\n</tool_call>", f"{call}\n", f"<tool_call>\n{call}", f"{call}\n"])


def glm_call(rng: random.Random, name: str, params: list[tuple[str, str]], cut: str) -> str:
    space = rng.choice(["", "\n", " "])
    body = "".join(f"<arg_key>{key}</arg_key>{space}<arg_value>{value}</arg_value>\n" for key, value in params)
    return f"<tool_call>{name}\n{body}{cut}" if cut else f"<tool_call>{name}\n{body}</tool_call>"


def minimax_call(rng: random.Random, name: str, params: list[tuple[str, str]], cut: str) -> str:
    quote = rng.choice(['"', "'", ""]) if name.strip() == name and name else '"'
    body = "".join(f'<parameter name={rng.choice(["", " "])}"{key}">{value}</parameter>\n' for key, value in params)
    call = f"<invoke name={quote}{name}{quote}>\n{body}"
    return call + cut if cut else f"{call}</invoke>\n"


# a DSML value's `string` attribute, whatever the value is (the schema may disagree)
ATTRIBUTES = ["", ' string="true"', ' string="false"', ' string="false" ']
NO_FINITE_JSON = {"[1e999]"}  # vLLM's DSML parse writes it as `[Infinity]`, no JSON; detok: the text as a string


def dsml_call(rng: random.Random, name: str, params: list[tuple[str, str]], cut: str) -> str:
    body = "".join(
        f'<｜DSML｜parameter name="{key}"{rng.choice(ATTRIBUTES)}>{value}</｜DSML｜parameter>\n'
        for key, value in params
        if value not in NO_FINITE_JSON
    )
    call = f'<｜DSML｜invoke name="{name}">\n{body}'
    return call + cut if cut else f"{call}</｜DSML｜invoke>\n"


WRITERS = {"qwen3_coder": qwen3_call, "glm47": glm_call, "minimax_m2": minimax_call, "deepseek_v32": dsml_call}
OPENINGS = {  # what a cut-off value follows, by family
    "qwen3_coder": lambda key: f"<parameter={key}>\n",
    "glm47": lambda key: f"<arg_key>{key}</arg_key>\n<arg_value>",
    "minimax_m2": lambda key: f'<parameter name="{key}">',
    "deepseek_v32": lambda key: f'<｜DSML｜parameter name="{key}" string="true">',
}


def stands(family: str, name: str, tools: list[dict[str, Any]] | None) -> bool:
    names_any = tools is None or family in ("qwen3_coder", "deepseek_v32")
    known = names_any or name.strip() in {t["function"]["name"] for t in tools}
    return bool(name.strip()) and known


def random_params(rng: random.Random, name: str) -> list[tuple[str, str]]:
    keys = {"get_weather": list(TOOLS[0]["function"]["parameters"]["properties"]), "search": ["q"]}.get(name, [])
    chosen = rng.sample([*keys, "extra"], rng.randrange(0, min(4, len(keys) + 2)))
    return [(key, rng.choice(VALUES[key])) for key in chosen]


def random_output(rng: random.Random, family: str) -> Output:
    tools = TOOLS if rng.random() < 0.8 else None
    text = "".join(rng.choice([*WORDS, *STRAYS[family]]) for _ in range(rng.randrange(0, 4)))
    stood = False
    for _ in range(rng.randrange(0, 4)):
        name = rng.choice(NAMES)
        text += WRITERS[family](rng, name, random_params(rng, name.strip()), "")
        stood = stood or stands(family, name, tools)
        # after a call, text; before any call stands only whitespace (see the module's docstring)
        text += "".join(rng.choice(WORDS if stood else ["\n", " "]) for _ in range(rng.randrange(0, 3)))
    if family == "minimax_m2" and rng.random() < 0.5:
        text = text.replace("<invoke", "<minimax:tool_call>\n<invoke", 1) + "</minimax:tool_call>"
    if family == "deepseek_v32" and rng.random() < 0.5:
        text = text.replace("<｜DSML｜invoke", "<｜DSML｜function_calls>\n<｜DSML｜invoke", 1) + rng.choice(
            ["</｜DSML｜function_calls>", "</｜DSML｜function_calls>\nafter"]
        )
    if rng.random() < 0.25:  # cut off inside a call: its name, a typed value (both drop it) or a string value
        where = rng.choice(["name", "typed", "string"]) if tools else rng.choice(["name", "string"])
        if where == "name":
            cut_call = {
                "qwen3_coder": "<function=get_wea",
                "glm47": "<tool_call>get_wea",
                "deepseek_v32": '<｜DSML｜invoke name="get_wea',
            }.get(family, '<invoke name="get_wea')
            return Output(family, text + cut_call, tools)
        key = "city" if where == "string" else "days"
        cut = OPENINGS[family](key) + ("4" if where == "typed" else PARTIAL)
        params = random_params(rng, "search")
        call = WRITERS[family](rng, "get_weather", params, cut)
        return Output(family, text + call, tools, (key, PARTIAL) if where == "string" else None)
    return Output(family, text, tools)


# outputs written by hand: tags in names, the lookahead end of a value, keys that run over a `</arg_key>`, the
# name's quotes and openings that are no parameter, stray closing markers, a DSML call that its block's end closes
EDGES = [
    Output(family, text, TOOLS)
    for family, text in (
        ("qwen3_coder", "<tool_call>\n<function=get<think>x>y>\n</function></tool_call>"),
        ("qwen3_coder", "<function=get_weather>\n<parameter=days>\n1\n<parameter=city>\n2\n</parameter></function>"),
        ("qwen3_coder", "<function=get_weather><parameter=days>5</function>"),
        ("qwen3_coder", "A <function=get_weather>< parameter = city >x</ parameter ></function> B"),
        ("qwen3_coder", "  \n<tool_call>\n<function=>\n</function>\n</tool_call>  "),
        ("glm47", "<tool_call>search<arg_key>a</arg_key>junk<arg_key>q</arg_key> <arg_value>v</arg_value></tool_call>"),
        ("glm47", "<tool_call>ping</tool_call>"),
        ("glm47", "<tool_call>nope<arg_key>q</arg_key><arg_value>v</arg_value></tool_call> x"),
        ("minimax_m2", "a</minimax:tool_call>b<invoke name=get_weather><parameter name='days'>2</parameter></invoke>"),
        ("minimax_m2", '<invoke name="search"><parameter name="a" x>1</parameter><parameter name=q>2</parameter>'),
        ("minimax_m2", '<invoke name=search><parameter name="">1</parameter><parameter name="q" >2</parameter>'),
        (
            "deepseek_v32",
            '<｜DSML｜function_calls><｜DSML｜invoke name="search"><｜DSML｜parameter name="q">'
            "v</｜DSML｜parameter></｜DSML｜function_calls>after<｜DSML｜function_calls>"
            '<｜DSML｜invoke name="ping"></｜DSML｜invoke></｜DSML｜function_calls>',
        ),
        (
            "deepseek_v32",
            '<｜DSML｜invoke name="get_weather"><｜DSML｜parameter name="days" string="true">2'
            '<｜DSML｜parameter name="city" string="false">"x"</｜DSML｜parameter></｜DSML｜invoke>',
        ),
        (
            "deepseek_v32",
            '<｜DSML｜invoke name="search"><｜DSML｜parameter name="" string="true">1</｜DSML｜parameter>'
            '<｜DSML｜parameter name="q"string="true">2</｜DSML｜parameter><｜DSML｜parameter  name="q" string="x" >3'
            "</｜DSML｜parameter></｜DSML｜invoke>",
        ),
    )
]
DUPLICATES = [
    Output("qwen3_coder", "<function=search><parameter=q>a</parameter><parameter=q>b</parameter></function>", TOOLS)
]
VLLM_NAMES = {"glm47": "glm45"}  # one parser in vLLM under both names: the test asks for the other one

VLLM_SCRIPT = """
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

tokenizer, answers = get_tokenizer(sys.argv[1]), []
for family, tools, text in json.loads(sys.stdin.read()):
    parser = ToolParserManager.get_tool_parser(family)(tokenizer)
    parser.skip_reasoning_parsing = True  # as vLLM's server sets it when no reasoning parser is named
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m", tools=tools)
    result = parser.extract_tool_calls(text, request)
    answers.append((result.content or "", [(c.function.name, c.function.arguments) for c in result.tool_calls]))
print(json.dumps(answers))
"""
Parsed = tuple[str, list[tuple[str, str]]]


def parsed(output: Output, sizes: list[int]) -> Parsed:
    parser = create_parser("", output.family, tool_types=parameter_types(output.tools))
    assert parser is not None
    out, at = ParsedOutput(), 0
    for size in sizes:
        out.extend(parser.feed(output.text[at : at + size]))
        at += size
    out.extend(parser.finish())
    # the pieces of a call after its first (which names it) join it: one entry a call, indexes counting from 0
    assert not out.reasoning and [piece.index for piece in out.tool_calls] == list(range(len(out.tool_calls)))
    return out.content, calls_of(out)


def recorded_outputs() -> list[Output]:
    """The recorded cases of these families (helpers/parse_cases.py) without a reasoning parser, with the tools their
    requests have."""
    return [
        Output(case.tool_call_parser, case.output, CASE_TOOLS)
        for case in CASES
        if case.tool_call_parser in SCHEMA_TOOL_CALL_PARSERS and not case.reasoning_parser
    ]


@pytest.fixture(scope="module")
def outputs() -> list[Output]:
    rng = random.Random(45)
    generated = [random_output(rng, family) for family in WRITERS for _ in range(70)]
    return generated + EDGES + DUPLICATES + recorded_outputs()


@pytest.fixture(scope="module")
def vllm_parses(outputs: list[Output], tmp_path_factory: pytest.TempPathFactory) -> list[Parsed]:
    qwen3 = tmp_path_factory.mktemp("qwen3")  # the tokenizer as vLLM loads one: a plain tokenizer.json
    (qwen3 / "tokenizer.json").write_text(fixture_tokenizer_json("qwen3"))
    config = FIXTURE_TOKENIZER_DIRS["qwen3"] / "tokenizer_config.json"
    (qwen3 / "tokenizer_config.json").write_text(config.read_text())
    batch = [(VLLM_NAMES.get(output.family, output.family), output.tools, output.text) for output in outputs]
    printed = run_vllm_script(VLLM_SCRIPT, [qwen3], json.dumps(batch))
    return [(content, [tuple(call) for call in calls]) for content, calls in json.loads(printed.splitlines()[-1])]


def agrees(output: Output, mine: Parsed, theirs: Parsed) -> None:
    (content, calls), (their_content, their_calls) = mine, theirs
    if their_calls:  # vLLM's whole parse strips the whitespace before the content's text; detok sends it
        assert content.endswith(their_content) and not content[: len(content) - len(their_content)].strip()
    else:
        assert content == their_content
    if output.cut is None:
        assert calls == their_calls
        return
    key, value = output.cut  # the cut value is detok's last parameter; vLLM's parse has none of it
    assert calls[:-1] == their_calls[:-1] and calls[-1][0] == their_calls[-1][0]
    assert json.loads(calls[-1][1]) == {**json.loads(their_calls[-1][1]), key: value}


@pytest.mark.parametrize("family", list(WRITERS))
def test_detoks_calls_are_vllms_in_any_pieces(family: str, outputs: list[Output], vllm_parses: list[Parsed]) -> None:
    rng = random.Random(family)
    checked = [(output, theirs) for output, theirs in zip(outputs, vllm_parses, strict=True) if output.family == family]
    for output, theirs in checked:
        whole = parsed(output, [len(output.text)])
        for _ in range(4):
            assert parsed(output, random_splits(len(output.text), rng)) == whole, output.text
        if output in DUPLICATES:  # written twice: the parsed object is vLLM's
            assert [(name, json.loads(arguments)) for name, arguments in whole[1]] == [
                (name, json.loads(arguments)) for name, arguments in theirs[1]
            ]
            continue
        agrees(output, whole, theirs)
    typed = sum('": "' not in arguments for _, calls in (theirs for _, theirs in checked) for _, arguments in calls)
    assert sum(bool(calls) for _, (_, calls) in checked) > 30 and typed > 10
    assert any(output.cut for output, _ in checked)


def test_recorded_cases_are_vllms(outputs: list[Output], vllm_parses: list[Parsed]) -> None:
    """The hand-written split of each recorded case (helpers/parse_cases.py) is vLLM's parse of its output."""
    theirs = dict(zip((output.text for output in outputs), vllm_parses, strict=True))
    cases = [case for case in CASES if case.tool_call_parser in SCHEMA_TOOL_CALL_PARSERS and not case.reasoning_parser]
    assert {case.tool_call_parser for case in cases} == set(WRITERS)
    for case in cases:
        assert theirs[case.output] == (case.content, case.tool_calls), case.name


def test_a_string_value_streams_as_it_is_written() -> None:
    """The call's first piece names it; a string value streams before its closing tag (its line break at the end
    held), a typed one comes whole at its closing tag, the "}" when the call ends."""
    parser = create_parser("", "qwen3_coder", tool_types=parameter_types(TOOLS))
    assert parser is not None
    streamed: list[tuple[str, str]] = []

    def feed(text: str) -> str:
        for char in text:
            streamed.extend((piece.name, piece.arguments) for piece in parser.feed(char).tool_calls)
        return "".join(arguments for _, arguments in streamed)

    assert feed("<function=get_weather>") == "{" and streamed[0] == ("get_weather", "{")
    assert feed("\n<parameter=city>\nParis is\n") == '{"city": "Paris is'
    assert feed("big\n</parameter>\n<parameter=days>\n12") == '{"city": "Paris is\\nbig"'
    assert feed("\n</parameter>\n") == '{"city": "Paris is\\nbig", "days": 12'
    assert [piece.arguments for piece in parser.finish().tool_calls] == ["}"]
    assert all(not name for name, _ in streamed[1:])


def test_a_dsml_value_streams_when_its_attribute_says_string() -> None:
    """DSML: a `string="true"` value of a string parameter streams as it is written; one without the attribute comes
    at its closing tag, parsed as JSON; the content keeps its trailing whitespace before the calls."""
    parser = create_parser("", "deepseek_v32", tool_types=parameter_types(TOOLS))
    assert parser is not None
    content: list[str] = []
    streamed: list[str] = []

    def feed(text: str) -> str:
        for char in text:
            out = parser.feed(char)
            content.append(out.content)
            streamed.extend(piece.arguments for piece in out.tool_calls)
        return "".join(streamed)

    assert feed('Hi \n<｜DSML｜invoke name="get_weather">') == "{"
    assert feed('<｜DSML｜parameter name="city" string="true">Paris is') == '{"city": "Paris is'
    assert feed('</｜DSML｜parameter><｜DSML｜parameter name="opts">{"a": ') == '{"city": "Paris is"'
    assert feed("[1]}</｜DSML｜parameter>") == '{"city": "Paris is", "opts": {"a": [1]}'
    assert feed("</｜DSML｜invoke>after") == '{"city": "Paris is", "opts": {"a": [1]}}'
    parser.finish()
    assert "".join(content) == "Hi \n"


@pytest.mark.parametrize(
    ("tokenizer", "family"), [("glm-markers", "glm47"), ("minimax-markers", "minimax_m2"), ("qwen3", "hermes")]
)
def test_auto_names_the_family_by_its_marker_tokens(tokenizer: str, family: str) -> None:
    """GLM's `<arg_key>` and MiniMax's `<minimax:tool_call>` tokens name their family; Qwen3-Coder's vocabulary is
    Qwen3's (its `<function=` is no token), so `auto` stays hermes there."""
    assert resolve("auto", load_fixture_tokenizer(tokenizer).token_to_id, tools=True) == family


def test_tool_types_of_odd_tools() -> None:
    """Tools that are not functions, or name no parameters, type nothing; the first tool of a name counts; types that
    do not decode end the request's parsing with an error."""
    tools = [
        {"type": "custom", "custom": {"name": "f"}},
        "junk",
        {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "string"}}}}},
        {"function": {"name": "g", "parameters": []}},
        {"type": "function", "function": {"name": "h", "parameters": {"properties": {"x": True, "y": {"type": "x"}}}}},
    ]
    assert json.loads(parameter_types(tools)) == {"f": {"n": ["integer"]}, "g": {}, "h": {"y": []}}
    assert parameter_types(None) == parameter_types([]) == ""
    with pytest.raises(ParserError):
        create_parser("", "glm47", tool_types='{"f": 1}')
