"""vLLM 0.32's own output parsers, run in vLLM's virtualenv on whole outputs the way its chat server reads a whole
answer (`Parser.parse`: the reasoning parser, then the tool-call parser on its content, `tool_choice` "auto"): the
reference the parse tests compare detok's parsers with, all of a test's outputs in one run."""

from __future__ import annotations

import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from helpers.fixtures import fixture_dir
from helpers.vllm_cpu import MODEL_CONFIG_DIR, model_dir, run_vllm_script

VLLM_SCRIPT = """
import json, sys
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.tokenizers import get_tokenizer

tokenizer = get_tokenizer(sys.argv[1])
tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], model="m", tools=tools, tool_choice="auto")
answers = []
for reasoning_parser, tool_call_parser, template_kwargs, text in json.loads(sys.stdin.read()):
    parser_class = ParserManager.get_parser(
        tool_parser_name=tool_call_parser or None, reasoning_parser_name=reasoning_parser or None,
        enable_auto_tools=True,
    )
    parser = parser_class(tokenizer, tools, chat_template_kwargs=template_kwargs, model_config=None)
    reasoning, content, calls = parser.parse(text, request, enable_auto_tools=True)
    answers.append((reasoning or "", content or "", [(call.name, call.arguments) for call in calls or []]))
print(json.dumps(answers))
"""

Parsed = tuple[str, str, list[tuple[str, str]]]  # reasoning, content, each call's name and arguments


@cache
def vllm_tokenizer_dir(name: str) -> Path:
    """A fixture tokenizer as vLLM loads one: a plain tokenizer.json (Qwen3's, or a marked one) beside a model config
    (without one vLLM's loader waits out its retries)."""
    if name == "qwen3":
        return model_dir()
    folder = Path(tempfile.mkdtemp(prefix=f"detok-vllm-{name}-"))
    for file in ("tokenizer.json", "tokenizer_config.json"):
        (folder / file).symlink_to(fixture_dir(name) / file)
    (folder / "config.json").symlink_to(MODEL_CONFIG_DIR / "config.json")
    return folder


def run_in_vllm(script: str, payload: Any, *tokenizers: str) -> Any:
    """`script` in vLLM's interpreter, with the directories of the fixture tokenizers `tokenizers` as its arguments
    and `payload` as JSON on its input; what it printed last, as JSON."""
    printed = run_vllm_script(script, [vllm_tokenizer_dir(name) for name in tokenizers], json.dumps(payload))
    return json.loads(printed.splitlines()[-1])


def vllm_parse(tokenizer: str, cases: list[tuple[str, str, dict[str, Any], str]]) -> list[Parsed]:
    """Each case (reasoning parser, tool-call parser ("" = none), the chat's template arguments, the output) as
    vLLM's server parses the whole answer, with the fixture tokenizer `tokenizer`."""
    return [
        (reasoning, content, [(name, arguments) for name, arguments in calls])
        for reasoning, content, calls in run_in_vllm(VLLM_SCRIPT, cases, tokenizer)
    ]
