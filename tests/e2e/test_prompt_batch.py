"""/v1/completions with several prompts (OpenAI's batch form), against a real `detok serve` whose echo source
answers each prompt with its own ids: prompt p's choice j is at index p * n + j with that prompt's text, echo and
logprobs; usage sums the prompts; streamed, every choice of every prompt comes in one stream, with echo, ids and
usage; a bad prompt in the batch is a 400 naming `prompt` and starts nothing. (Side by side with vLLM's server on
seeded sampling: tests/e2e/test_vllm_flags.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.serve_helpers import ServeProcess, serving

PROMPTS = ["Hello there", "Jellyfish \U0001fabc swim", "\u4eca\u5929\u7684\u5929\u6c14"]


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving("--workers", "2", "--source", "echo", "--step-interval-ms", "2") as process:
        yield process


def post(service: ServeProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{service.url}/v1/completions", json={"max_tokens": 60, **body}, timeout=30)


def test_each_prompts_choices_in_order_with_usage_summed(service: ServeProcess, qwen3: Any) -> None:
    answer = post(service, {"prompt": PROMPTS, "n": 2})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [choice["index"] for choice in body["choices"]] == list(range(6))
    texts = [choice["text"] for choice in sorted(body["choices"], key=lambda choice: choice["index"])]
    assert texts == [prompt for prompt in PROMPTS for _ in range(2)]  # the echo source: each prompt's own ids
    prompt_tokens = sum(len(qwen3.encode(prompt).ids) for prompt in PROMPTS)
    completion_tokens = 2 * sum(len(qwen3.encode(prompt).ids) + 1 for prompt in PROMPTS)  # + EOS each
    assert body["usage"] == {
        **body["usage"],
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"


def test_token_id_prompts_with_echo_and_logprobs(service: ServeProcess, qwen3: Any) -> None:
    ids = [qwen3.encode(prompt).ids for prompt in PROMPTS[:2]]
    answer = post(service, {"prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 3})
    assert answer.status_code == 200, answer.text
    for index, choice in enumerate(answer.json()["choices"]):
        assert choice["index"] == index
        assert choice["text"] == qwen3.decode(ids[index]) + qwen3.decode(ids[index][:3])  # echo, then 3 echoed ids
        assert len(choice["logprobs"]["tokens"]) == 3


def streamed(service: ServeProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    chunks = []
    with httpx.stream("POST", f"{service.url}/v1/completions", json={"max_tokens": 60, **body}, timeout=30) as answer:
        assert answer.status_code == 200, answer.read()
        lines = [line for line in answer.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        assert line.startswith("data: {"), line
        chunks.append(json.loads(line[6:]))
    return chunks


def test_a_stream_of_several_prompts_has_every_prompts_choices(service: ServeProcess, qwen3: Any) -> None:
    body = {"prompt": PROMPTS, "n": 2, "stream": True, "echo": True, "return_token_ids": True}
    chunks = streamed(service, {**body, "stream_options": {"include_usage": True}})
    texts: dict[int, str] = {}
    prompt_ids: dict[int, list[int]] = {}
    finishes: dict[int, str] = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice.get("prompt_token_ids"):
            prompt_ids.setdefault(choice["index"], choice["prompt_token_ids"])
        if choice.get("finish_reason"):
            finishes[choice["index"]] = choice["finish_reason"]
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]} and chunks[0]["id"].startswith("cmpl-")
    assert len({chunk["created"] for chunk in chunks}) == 1
    # echo with return_token_ids: the prompt's ids (not its text), then the echo source's output: the prompt again
    assert texts == {index: PROMPTS[index // 2] for index in range(6)}
    assert prompt_ids == {index: qwen3.encode(PROMPTS[index // 2]).ids for index in range(6)}
    assert finishes == dict.fromkeys(range(6), "stop")
    prompt_tokens = sum(len(qwen3.encode(prompt).ids) for prompt in PROMPTS)
    completion_tokens = 2 * sum(len(qwen3.encode(prompt).ids) + 1 for prompt in PROMPTS)  # + EOS each
    usage = chunks[-1]["usage"]
    assert (chunks[-1]["choices"], usage["prompt_tokens"], usage["completion_tokens"]) == (
        [],
        prompt_tokens,
        completion_tokens,
    )


def test_a_bad_prompt_in_a_batch_refuses_the_request(service: ServeProcess) -> None:
    """The prompts before the bad one were already submitted: they are aborted, not left to run (streamed or not)."""
    aborted = httpx.get(f"{service.url}/stats").json()["front"].get("aborted", 0)
    long = "fine " * 300  # still generating when the bad prompt is found
    for stream in (False, True):
        bad = post(service, {"prompt": [long, "", "also fine"], "stream": stream, "max_tokens": 400})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt", bad.text
    stats = httpx.get(f"{service.url}/stats").json()
    assert stats["front"]["live_rids"] == 0
    assert stats["front"].get("aborted", 0) == aborted + 2
