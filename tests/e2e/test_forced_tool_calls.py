"""A chat `tool_choice` that forces calls ("required", a named function) gives `tool_calls`, shaped as vLLM's server
shapes them, against a real `detok serve` whose engine replays a recorded Qwen3 output of the constrained JSON:
streamed, each call's first piece names it and its arguments arrive as written; whole, the message's content is ""
and (required) each call's arguments are its parameters written back as JSON; `parallel_tool_calls: false` keeps
the first call; front.tool_call_parser "none" leaves the JSON as content."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fixtures import load_fixture_tokenizer
from helpers.serve_helpers import ServeProcess, trace_service

from detok_worker.bus.messages import RequestParams
from detok_worker.trace.format import TraceWriter, make_header

TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {key: {"type": "string"}}}},
    }
    for name, key in (("get_weather", "city"), ("get_time", "tz"))
]
MESSAGES = [{"role": "user", "content": "Weather and time in Paris?"}]
# as a model writes them under the constraint: spacing of its own, non-ASCII text
REQUIRED_OUTPUT = (
    '[{"name": "get_weather", "parameters": {"city":  "Paris"}},\n'
    ' {"name": "get_time", "parameters": {"tz": "CET", "note": "caf\u00e9"}}]'
)
WRITTEN = ['{"city":  "Paris"}', '{"tz": "CET", "note": "caf\u00e9"}']  # the arguments as the model wrote them
NAMED_OUTPUT = '{"city": "Paris", "when": "now \u2600"}'


def replaying(tmp_path: Path, output: str, *extra: str) -> AbstractContextManager[ServeProcess]:
    """A service whose engine answers every request with `output` (Qwen3's ids, then <|im_end|>)."""
    tokenizer = load_fixture_tokenizer("qwen3")
    path = tmp_path / f"replay-{abs(hash((output, extra)))}.trace"
    ids = [*tokenizer.encode(output).ids, tokenizer.token_to_id("<|im_end|>")]
    with TraceWriter(path, make_header(tokenizer, "test")) as writer:
        writer.request("rec-1", [], RequestParams(max_tokens=500), t_ns=0)
        writer.tokens("rec-1", ids, "stop", t_ns=1)
    return trace_service(path, *extra)


def chat(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS, **fields})
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def streamed(http: httpx.Client, **fields: Any) -> tuple[list[dict[str, Any]], str]:
    """(the tool call pieces of every chunk, the last finish_reason); no content is streamed."""
    body = {"messages": MESSAGES, "tools": TOOLS, "stream": True, **fields}
    pieces: list[dict[str, Any]] = []
    finish = ""
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                assert not choice["delta"].get("content"), choice
                pieces.extend(choice["delta"].get("tool_calls") or [])
                finish = choice.get("finish_reason") or finish
    return pieces, finish


def calls_of(pieces: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(id, name, arguments) per call index, from streamed pieces: only a call's first piece has its id and name."""
    calls: dict[int, list[str]] = {}
    for piece in pieces:
        if piece["index"] not in calls:
            assert piece["id"].startswith("chatcmpl-tool-") and piece["type"] == "function", piece
            calls[piece["index"]] = [piece["id"], piece["function"]["name"], ""]
        else:
            assert "id" not in piece and not piece["function"].get("name"), piece
        calls[piece["index"]][2] += piece["function"].get("arguments") or ""
    return [(call[0], call[1], call[2]) for _, call in sorted(calls.items())]


@pytest.fixture(scope="module")
def required(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with (
        replaying(tmp_path_factory.mktemp("required"), REQUIRED_OUTPUT) as serve,
        httpx.Client(base_url=serve.url, timeout=60) as http,
    ):
        yield http


def test_required_gives_each_call_whole_with_its_parameters_as_json(required: httpx.Client) -> None:
    choice = chat(required, tool_choice="required")
    message = choice["message"]
    assert message["content"] == ""
    calls = [(call["type"], call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]]
    assert calls == [
        ("function", "get_weather", json.dumps({"city": "Paris"})),
        ("function", "get_time", json.dumps({"tz": "CET", "note": "caf\u00e9"}, ensure_ascii=False)),
    ]
    assert len({call["id"] for call in message["tool_calls"]}) == 2
    assert choice["finish_reason"] == "tool_calls"


def test_required_streams_each_call_as_written(required: httpx.Client) -> None:
    pieces, finish = streamed(required, tool_choice="required")
    calls = calls_of(pieces)
    assert [(name, arguments) for _, name, arguments in calls] == list(
        zip(["get_weather", "get_time"], WRITTEN, strict=True)
    )
    assert len(pieces) > len(calls)  # the arguments arrive in fragments
    assert finish == "tool_calls"


def test_parallel_tool_calls_false_keeps_the_first_call(required: httpx.Client) -> None:
    message = chat(required, tool_choice="required", parallel_tool_calls=False)["message"]
    assert [call["function"]["name"] for call in message["tool_calls"]] == ["get_weather"]
    pieces, _ = streamed(required, tool_choice="required", parallel_tool_calls=False)
    assert [(name, arguments) for _, name, arguments in calls_of(pieces)] == [("get_weather", WRITTEN[0])]


def test_named_function_gives_one_call_whose_arguments_are_the_output(tmp_path: Path) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    with replaying(tmp_path, NAMED_OUTPUT) as serve, httpx.Client(base_url=serve.url, timeout=60) as http:
        choice = chat(http, tool_choice=named)
        pieces, finish = streamed(http, tool_choice=named)
    message = choice["message"]
    assert message["content"] == ""
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("get_weather", NAMED_OUTPUT)
    ]
    assert choice["finish_reason"] == "stop"  # OpenAI's (and vLLM's) finish for a named call
    assert [(name, arguments) for _, name, arguments in calls_of(pieces)] == [("get_weather", NAMED_OUTPUT)]
    assert finish == "stop"


def test_without_a_tool_call_parser_the_json_stays_content(tmp_path: Path) -> None:
    """front.tool_call_parser "none" (on --source vllm: no --enable-auto-tool-choice): as vLLM's server without
    its auto tool choice, the constrained JSON is the content."""
    with (
        replaying(tmp_path, REQUIRED_OUTPUT, "--set", "front.tool_call_parser=none") as serve,
        httpx.Client(base_url=serve.url, timeout=60) as http,
    ):
        message = chat(http, tool_choice="required")["message"]
    assert message["content"] == REQUIRED_OUTPUT
    assert not message.get("tool_calls")
