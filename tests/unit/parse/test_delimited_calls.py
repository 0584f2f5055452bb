"""DeepSeek-V3.1's tool calls (`--tool-call-parser deepseek_v31`): random outputs of calls, text and stray markup,
parsed by detok in random pieces and whole, and by vLLM 0.32's own parser of the family (in vLLM's virtualenv) on
the whole text: the same content and calls. The differences kept, where vLLM's whole-output parse drops what its
streaming sent: a call the end of the output cut short keeps what was streamed of it, and a call whose arguments
hold a line break is a call."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers.serve_helpers import REPO
from helpers.tokenizer_files import fixture_tokenizer_json
from helpers.vllm_cpu import run_vllm_script

from detok_worker.parse.base import ParsedOutput
from detok_worker.parse.registry import TOOL_CALL_PARSERS

BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
WORDS = ["Hi.", " ok", "\n", "天气", " 😀", '{"city": "Paris"}', '{"a": [1, {"b": "}"}]}', "get_weather", "x"]
# a call's arguments without line breaks: vLLM's whole-output pattern does not match across one (its streaming
# does), so a call with one is dropped there and kept by detok
ARGUMENT_WORDS = [word for word in WORDS if "\n" not in word]

VLLM_SCRIPT = """
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tokenizers import get_tokenizer
from vllm.tool_parsers import ToolParserManager

parser = ToolParserManager.get_tool_parser("deepseek_v31")(get_tokenizer(sys.argv[1]))
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m", tools=tools)
answers = []
for text in json.loads(sys.stdin.read()):
    result = parser.extract_tool_calls(text, request)
    calls = [(call.function.name, call.function.arguments) for call in result.tool_calls]
    answers.append((result.content or "", calls))
print(json.dumps(answers))
"""


def random_output(rng: random.Random) -> tuple[str, bool]:
    """A model output, and whether its last call is cut short by its end."""
    text = "".join(rng.choice(WORDS) for _ in range(rng.randrange(0, 3)))
    if rng.random() < 0.2:
        return text, False  # no calls
    text += BEGIN
    for _ in range(rng.randrange(0, 4)):
        text += rng.choice(["", "\n", " junk "])  # between calls: markup
        text += (
            CALL
            + rng.choice(["get_weather", "time", "名"])
            + SEP
            + "".join(rng.choice(ARGUMENT_WORDS) for _ in range(2))
        )
        text += CALL_END
    cut = rng.random() < 0.2
    if cut:
        text += CALL + "get_weather" + SEP + '{"city": "Par'
    else:
        text += rng.choice([END, END + "\n", ""])
    return text, cut


def parsed(text: str, sizes: list[int]) -> tuple[str, list[tuple[str, str]]]:
    stage = TOOL_CALL_PARSERS["deepseek_v31"]()
    out = ParsedOutput()
    at = 0
    for size in sizes:
        stage.feed(text[at : at + size], out)
        at += size
    stage.finish(out)
    calls: dict[int, list[str]] = {}
    for piece in out.tool_calls:
        entry = calls.setdefault(piece.index, ["", ""])
        entry[0] += piece.name
        entry[1] += piece.arguments
    assert not out.reasoning
    return out.content, [(name, arguments) for name, arguments in calls.values()]


def pieces(length: int, rng: random.Random) -> list[int]:
    sizes = []
    while sum(sizes) < length:
        sizes.append(rng.randrange(1, 6))
    return sizes or [0]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DeepSeek-V3 fixture as vLLM loads a tokenizer (a plain tokenizer.json beside its config)."""
    folder = tmp_path_factory.mktemp("deepseek-v3")
    (folder / "tokenizer.json").write_text(fixture_tokenizer_json("deepseek-v3"))
    source = REPO / "tests" / "fixtures" / "tokenizers" / "deepseek-v3" / "tokenizer_config.json"
    (folder / "tokenizer_config.json").write_text(source.read_text())
    return folder


def test_detoks_calls_are_vllms_in_any_pieces(tokenizer_dir: Path) -> None:
    rng = random.Random(31)
    outputs = [random_output(rng) for _ in range(80)]
    printed = run_vllm_script(VLLM_SCRIPT, [tokenizer_dir], json.dumps([text for text, _ in outputs]))
    theirs = [(content, [tuple(call) for call in calls]) for content, calls in json.loads(printed.splitlines()[-1])]
    for (text, cut), (content, calls) in zip(outputs, theirs, strict=True):
        whole = parsed(text, [len(text)])
        for _ in range(4):
            assert parsed(text, pieces(len(text), rng)) == whole, text
        if cut:  # the cut call is detok's last, with what it had; vLLM's whole parse has none of it
            assert whole[1][-1] == ("get_weather", '{"city": "Par') and (whole[0], whole[1][:-1]) == (content, calls)
        else:
            assert whole == (content, calls), text
    assert sum(bool(calls) for _, calls in theirs) > 40 and any(cut for _, cut in outputs)
