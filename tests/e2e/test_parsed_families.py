"""The official `openai` client against a real `detok serve` per model family, each with its own tokenizer and its
parsers named explicitly, whose engine stub replays recorded outputs (the case table in helpers/parse_cases.py)
from a trace: non-streamed `reasoning_content`, `content` and `tool_calls` equal both the hand-written split and the
parser applied to the full decode, and the streamed pieces of each field concatenate to the non-streamed field.

Each output is recorded several times with different token timing, so the paced replay (replay speed 1) hands the
ids to the worker in different TokenBatch splits; the trace source replays its recordings round robin, and each
test makes one request per recording, in order. The exhaustive every-split property is the unit tests'
(tests/unit/parse/test_parsed_stream.py); this checks that the whole service (front, bus, worker, HTTP, the client)
keeps it.

The tokenizers: Qwen3 (embedded), DeepSeek-V3 for DeepSeek-R1 and V3.1's tool calls, gpt-oss, and the
SentencePiece Mistral v1 fixture, whose vocabulary has no `[TOOL_CALLS]` token (the marker is plain text there). No
Llama-3 tokenizer is available offline (its licence keeps it out of the repo, see
tests/fixtures/tokenizers/LICENSES.md): the Llama-3 JSON tool-call output (`<|python_tag|>` + JSON calls) is written
on the byte-level DeepSeek-V3 fixture, where `<|python_tag|>` is plain text, not a special token. No GLM, MiniMax or
Kimi tokenizer is available offline either: their outputs are written on the DeepSeek-V3 fixture with each family's
markers added as special tokens (helpers/fixtures.py MARKED_FIXTURES), so the front must decode them
(`skip_special_tokens` off for those parsers). The requests offer tools with typed parameters
(helpers/parse_cases.py TOOLS): the XML-parameter families' arguments (`"days": 3`, not `"3"`) show that the tools'
types reach the worker's parser. Olmo 3's and Granite's reasoning markers are plain text: their outputs are written on
the DeepSeek-V3 fixture.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers.fixtures import fixture_dir, load_fixture_tokenizer
from helpers.parse_cases import CASES, TOOLS, OutputCase, calls_of, case_ids, random_splits, whole_parse
from helpers.serve_helpers import serving

from detok_worker.bus.messages import RequestParams
from detok_worker.trace.format import TraceWriter, make_header

SPLITS_PER_CASE = 3
GROUP_GAP_NS = 5_000_000  # between the recorded batches: several engine steps (--step-interval-ms 1) apart
CASES_BY_NAME = {case.name: case for case in CASES}
FAMILIES = {
    "qwen3": ["qwen3-think-tool"],
    "deepseek-r1": ["deepseek-r1", "deepseek-r1-repeats-think"],
    "gpt-oss": ["gpt-oss-final", "gpt-oss-preamble-tool"],  # analysis + final; analysis + preamble + a call
    "llama3": ["llama3-json"],
    "mistral": ["mistral", "mistral-v11"],  # [TOOL_CALLS][{...}] and the v11+ [TOOL_CALLS]name[ARGS]{...}
    "deepseek-v31": ["deepseek-v31-tools"],  # the markers are special tokens of the V3 vocabulary
    "qwen3-coder": ["qwen3-coder-tools"],  # XML parameters, typed by the request's tools
    "glm": ["glm47-tools"],
    "minimax": ["minimax-m2-tools"],
    "deepseek-v32": ["deepseek-v32-tools"],  # DSML calls; the markers are text of the V3 vocabulary
    "glm45-think": ["glm45-think-tools"],  # glm45 reasoning, then its calls
    "minimax-m2-think": ["minimax-m2-think-tools"],  # minimax_m2 reasoning (no opening marker), then its calls
    "kimi-k2": ["kimi-k2-think-tools"],  # reasoning, content, two calls; the markers are special tokens
    "minimax-m2-append-think": ["minimax-m2-append-think"],
    "olmo3": ["olmo3-think"],
    "granite": ["granite-think"],
}
# The gpt-oss and Mistral fixtures ship no chat template: the shape of the model's own (only the prompt's end
# matters here, and the cases' prompt_tail is what these render).
CHAT_TEMPLATES = {
    "gpt-oss": "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}"
    "<|start|>assistant",
    "mistral": "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}",
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
Calls = list[tuple[str, str]]


@dataclass
class FamilyService:
    client: openai.OpenAI
    model: str
    recordings: list[OutputCase]  # the trace's requests, in the order the stub replays them (round robin)
    splits: list[list[int]]  # the batch sizes each recording's timing asks for
    requests: int = 0  # made so far: the next request gets recording `requests % len(recordings)`

    def next_recording(self) -> tuple[OutputCase, list[int]]:
        index = self.requests % len(self.recordings)
        self.requests += 1
        return self.recordings[index], self.splits[index]


def record(writer: TraceWriter, rid: str, tail: list[int], ids: list[int], sizes: list[int]) -> None:
    """One recorded request whose ids come in batches of `sizes`, batch k at k * GROUP_GAP_NS."""
    writer.request(rid, tail, RequestParams(max_tokens=500), t_ns=0)
    start = 0
    for step, size in enumerate(sizes):
        finish = "stop" if step == len(sizes) - 1 else None
        writer.tokens(rid, ids[start : start + size], finish, t_ns=step * GROUP_GAP_NS)
        start += size


def parser_flags(cases: list[OutputCase]) -> list[str]:
    reasoning = {case.reasoning_parser for case in cases}
    tools = {case.tool_call_parser for case in cases} - {""}
    assert len(reasoning) == 1 and len(tools) <= 1, "one service serves one parser pair"
    return ["--reasoning-parser", reasoning.pop() or "none", "--tool-call-parser", tools.pop() if tools else "none"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def service(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FamilyService]:
    cases = [CASES_BY_NAME[name] for name in FAMILIES[request.param]]
    tokenizer_name = cases[0].tokenizer
    tokenizer = load_fixture_tokenizer(tokenizer_name)
    rng = random.Random(request.param)
    recordings, splits = [], []
    path: Path = tmp_path_factory.mktemp("trace") / f"{request.param}.trace"
    with TraceWriter(path, make_header(tokenizer, "test")) as writer:
        for case in cases:
            tail, ids = case_ids(tokenizer, case)
            for _ in range(SPLITS_PER_CASE):
                sizes = random_splits(len(ids), rng)
                record(writer, f"rec-{len(recordings)}", tail, ids, sizes)
                recordings.append(case)
                splits.append(sizes)
    template_flags = []
    if request.param in CHAT_TEMPLATES:
        template = path.with_suffix(".jinja")
        template.write_text(CHAT_TEMPLATES[request.param])
        template_flags = ["--set", f"tokenizer.chat_template={template}"]
    with serving(
        "--workers", "1", "--tokenizer", str(fixture_dir(tokenizer_name)),
        "--source", "trace", "--trace", str(path), "--replay-speed", "1", "--step-interval-ms", "1",
        *parser_flags(cases), *template_flags,
    ) as serve:  # fmt: skip
        client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="none")
        yield FamilyService(client, client.models.list().data[0].id, recordings, splits)


def expected_of(case: OutputCase) -> tuple[str, str, Calls]:
    """The hand-written split, checked against the parser applied to the full decode."""
    parsed = whole_parse(load_fixture_tokenizer(case.tokenizer), case)
    assert (parsed.reasoning, parsed.content, calls_of(parsed)) == (case.reasoning, case.content, case.tool_calls)
    return case.reasoning, case.content, case.tool_calls


def check_call_id(case: OutputCase, index: int, call_id: str) -> None:
    """The model's own id of the call (Kimi-K2's), else one the front made."""
    if case.tool_call_ids:
        assert call_id == case.tool_call_ids[index], f"{case.name}: call {index}"
    else:
        assert call_id.startswith("chatcmpl-tool-"), f"{case.name}: call {index}"


def whole(service: FamilyService, case: OutputCase) -> tuple[str, str, Calls, str | None]:
    response = service.client.chat.completions.create(model=service.model, messages=MESSAGES, tools=TOOLS)
    choice = response.choices[0]
    message: Any = choice.message
    calls = [(call.function.name, call.function.arguments) for call in message.tool_calls or []]
    assert all(call.type == "function" for call in message.tool_calls or [])
    for index, call in enumerate(message.tool_calls or []):
        check_call_id(case, index, call.id)
    return message.reasoning_content or "", message.content or "", calls, choice.finish_reason


def streamed(
    service: FamilyService, case: OutputCase
) -> tuple[list[str], list[str], dict[int, tuple[list[str], list[str]]], str]:
    """Every streamed piece of each field: reasoning, content, and per tool-call index its names and arguments."""
    reasoning, content, calls, finishes = [], [], {}, []
    stream = service.client.chat.completions.create(model=service.model, messages=MESSAGES, tools=TOOLS, stream=True)
    for chunk in stream:
        delta: Any = chunk.choices[0].delta
        reasoning.append(getattr(delta, "reasoning_content", None) or "")
        content.append(delta.content or "")
        for call in delta.tool_calls or []:
            names, arguments = calls.setdefault(call.index, ([], []))
            if call.function.name:
                check_call_id(case, call.index, call.id)
                names.append(call.function.name)
            arguments.append(call.function.arguments or "")
        finishes.append(chunk.choices[0].finish_reason)
    assert [finish for finish in finishes if finish] == [finishes[-1]], "one finish, on the last chunk"
    return reasoning, content, calls, finishes[-1]


def finish_of(case: OutputCase) -> str:
    return "tool_calls" if case.tool_calls else case.finish


def test_whole_response_equals_the_parse_of_the_full_decode(service: FamilyService) -> None:
    for _ in service.recordings:
        case, sizes = service.next_recording()
        reasoning, content, calls, finish = whole(service, case)
        assert (reasoning, content, calls) == expected_of(case), f"{case.name}, batches {sizes}"
        assert finish == finish_of(case)


def test_streamed_pieces_concatenate_to_the_whole_field(service: FamilyService) -> None:
    for _ in service.recordings:
        case, sizes = service.next_recording()
        reasoning, content, calls, finish = streamed(service, case)
        assert ("".join(reasoning), "".join(content)) == expected_of(case)[:2], f"{case.name}, batches {sizes}"
        assert sorted(calls) == list(range(len(calls))), "tool-call indexes count from 0"
        for names, _ in calls.values():
            assert len(names) == 1, "a call is named once, on its first piece"
        assert [(calls[i][0][0], "".join(calls[i][1])) for i in sorted(calls)] == case.tool_calls
        assert finish == finish_of(case)
