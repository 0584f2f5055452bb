"""A real model through a real `detok serve --source llama-cpp`: SmolLM2-135M-Instruct generates greedily (the same
ids on every run), detok's workers turn them into text, the front streams it. Each client's text equals llama.cpp's
own detokenization of the ids the same generation gives in this process, cut by stop strings taken from that text
(hidden and visible); usage counts the ids. Generating in the engine's plan() must not cost a worker its place."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from helpers.fault_helpers import serving
from helpers.llama_oracle import greedy_ids, llama_detokenize, smollm2
from helpers.serve_helpers import ServeProcess, http_json

from detok_worker.tokenizer import create_tokenizer
from engine_stub.llama_source import default_model_path

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
PROMPTS = [
    [SYSTEM, {"role": "user", "content": "Write a haiku about the sea."}],
    [SYSTEM, {"role": "user", "content": "Translate 'good morning' into Chinese, Japanese and Korean."}],
    [{"role": "user", "content": "Reply with three emoji about cats."}],
    [{"role": "user", "content": "Name three primes."}],
]
MAX_TOKENS = 32


@dataclass(frozen=True)
class Case:
    messages: list[dict[str, str]]
    stop: str | None = None
    visible: bool = False

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": self.messages,
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.stop is not None:
            body["stop"] = [self.stop]
            body["include_stop_str_in_output"] = self.visible
        return body


@dataclass
class Streamed:
    text: str
    finish_reason: str | None
    completion_tokens: int | None


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    args = ("--tokenizer", str(default_model_path()), "--source", "llama-cpp", "--step-interval-ms", "2")
    with serving(ServeProcess(*args)) as serve:
        yield serve


@pytest.fixture(scope="module")
def generated() -> list[list[int]]:
    """The ids the service's source generates for each prompt (detok's tokenizer renders and encodes the prompt,
    as the front does; test_tokenizer_gguf_smollm2 checks those ids are llama.cpp's)."""
    tokenizer = create_tokenizer(str(default_model_path()))
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(m, add_generation_prompt=True)).ids for m in PROMPTS]
    return [greedy_ids(prompt, MAX_TOKENS) for prompt in prompts]


def _stop_in(text: str) -> str:
    """A stop string that occurs in `text`: five characters from its second half, not all whitespace."""
    start = len(text) // 2
    while not text[start : start + 5].strip():
        start += 1
    return text[start : start + 5]


def _expected(case: Case, ids: list[int]) -> Streamed:
    text = llama_detokenize(ids, special=False)
    ended_by_model = ids[-1] in smollm2().end_of_generation_ids
    if case.stop is None:
        return Streamed(text, "stop" if ended_by_model else "length", len(ids))
    cut = text.find(case.stop) + (len(case.stop) if case.visible else 0)
    return Streamed(text[:cut], "stop", None)


async def _stream_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> Streamed:
    parts: list[str] = []
    streamed = Streamed("", None, None)
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            assert "error" not in event, event
            if event.get("usage"):
                streamed.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event["choices"]:
                parts.append(choice["delta"].get("content") or "")
                streamed.finish_reason = choice.get("finish_reason") or streamed.finish_reason
    streamed.text = "".join(parts)
    return streamed


async def _run_all(service: ServeProcess, bodies: list[dict[str, Any]]) -> list[Streamed]:
    async with httpx.AsyncClient(base_url=service.url, timeout=120) as client:
        return await asyncio.gather(*(_stream_chat(client, body) for body in bodies))


def test_streamed_text_is_llama_cpp_detokenization_with_real_stop_strings(
    service: ServeProcess, generated: list[list[int]]
) -> None:
    assert all(len(ids) >= 5 for ids in generated)
    cases: list[tuple[Case, list[int]]] = []
    for number, (messages, ids) in enumerate(zip(PROMPTS, generated, strict=True)):
        stop = _stop_in(llama_detokenize(ids, special=False))
        cases += [(Case(messages), ids), (Case(messages, stop, visible=number % 2 == 1), ids)]
    status, models = http_json(f"{service.url}/v1/models")
    assert status == 200
    model = models["data"][0]["id"]
    pids_before = {worker["pid"] for worker in service.stats()["workers"].values()}

    results = asyncio.run(_run_all(service, [case.body(model) for case, _ in cases]))

    for (case, ids), streamed in zip(cases, results, strict=True):
        expected = _expected(case, ids)
        assert streamed.text == expected.text, (case.messages[-1]["content"], case.stop, case.visible)
        assert streamed.finish_reason == expected.finish_reason
        if expected.completion_tokens is not None:
            assert streamed.completion_tokens == expected.completion_tokens
    assert any(ids[-1] not in smollm2().end_of_generation_ids for ids in generated)  # some end by max_tokens
    stats = service.stats()
    assert len(stats["engine"]["workers"]) == 2
    assert stats["engine"]["reopened"] == 0
    assert {worker["pid"] for worker in stats["workers"].values()} == pids_before
    assert "missed its heartbeats" not in service.log(tail=None)
