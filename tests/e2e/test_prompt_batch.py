"""/v1/completions with several prompts (OpenAI's batch form), against a real `detok serve` whose echo source
answers each prompt with its own ids: prompt p's choice j is at index p * n + j with that prompt's text, echo and
logprobs; usage sums the prompts; a stream of several prompts and a bad prompt in the batch are 400s naming
`prompt`. (Side by side with vLLM's server on seeded sampling: tests/e2e/test_vllm_flags.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.serve_helpers import ServeProcess, healthy_serve

PROMPTS = ["Hello there", "Jellyfish \U0001fabc swim", "\u4eca\u5929\u7684\u5929\u6c14"]


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with healthy_serve("--workers", "2", "--source", "echo", "--step-interval-ms", "2") as process:
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


def test_a_stream_of_several_prompts_and_a_bad_prompt_are_refused(service: ServeProcess) -> None:
    streamed = post(service, {"prompt": PROMPTS, "stream": True})
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "prompt"
    bad = post(service, {"prompt": ["fine", ""]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt", bad.text
