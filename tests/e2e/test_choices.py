"""n > 1, echo and stream_options.continuous_usage_stats through a real `detok serve --workers 2 --source echo`
with the official `openai` client. The echo source generates the prompt's own ids (then EOS), so each choice's
text is computable from the tokenizer alone (helpers/echo_source.py); every choice is asserted exact."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.echo_source import chat_prompt_ids, expected_echo
from helpers.serve_helpers import ServeProcess, http_json, serving, wait_for

openai = pytest.importorskip("openai")

PROMPT = "Grüße 😀 from 日本! def f(x): return x"
MESSAGES = [{"role": "user", "content": PROMPT}]
USAGE = {"include_usage": True}


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving("--workers", "2", "--source", "echo", "--step-interval-ms", "2") as serve:
        yield serve


@pytest.fixture(scope="module")
def model(service: ServeProcess) -> str:
    return http_json(f"{service.url}/v1/models")[1]["data"][0]["id"]


@pytest.fixture
def client(service: ServeProcess) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0, timeout=60) as api:
        yield api


class Streamed:
    """A stream's chunks gathered per choice index."""

    def __init__(self, chunks: Any, field: str) -> None:
        self.texts: dict[int, str] = defaultdict(str)
        self.finishes: dict[int, list[str]] = defaultdict(list)
        self.running: dict[int, list[Any]] = defaultdict(list)  # per choice: the usage each of its chunks carries
        self.usage: Any = None
        for chunk in chunks:
            if not chunk.choices:
                self.usage = chunk.usage
            for choice in chunk.choices:
                piece = choice.text if field == "text" else choice.delta.content
                self.texts[choice.index] += piece or ""
                if choice.finish_reason is not None:
                    self.finishes[choice.index].append(choice.finish_reason)
                self.running[choice.index].append(chunk.usage)


def test_n_completions_whole_and_streamed(client: Any, model: str, tokenizer: Any) -> None:
    ids = tokenizer.encode(PROMPT, add_special_tokens=True).ids
    for max_tokens in (5, 512):  # cut by length, and ended by EOS
        text, finish, tokens = expected_echo(tokenizer, ids, max_tokens)
        whole = client.completions.create(model=model, prompt=PROMPT, n=3, max_tokens=max_tokens, seed=7)
        assert [choice.index for choice in whole.choices] == [0, 1, 2]
        assert [(choice.text, choice.finish_reason) for choice in whole.choices] == [(text, finish)] * 3
        assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), 3 * tokens)
        chunks = client.completions.create(
            model=model, prompt=PROMPT, n=3, max_tokens=max_tokens, stream=True, stream_options=USAGE
        )
        streamed = Streamed(chunks, "text")
        assert dict(streamed.texts) == {0: text, 1: text, 2: text}
        assert dict(streamed.finishes) == {0: [finish], 1: [finish], 2: [finish]}
        assert (streamed.usage.prompt_tokens, streamed.usage.completion_tokens) == (len(ids), 3 * tokens)
        assert streamed.usage.total_tokens == len(ids) + 3 * tokens


def test_n_chats_whole_and_streamed(client: Any, model: str, tokenizer: Any) -> None:
    ids = chat_prompt_ids(tokenizer, MESSAGES)
    text, finish, tokens = expected_echo(tokenizer, ids, 512)
    whole = client.chat.completions.create(model=model, messages=MESSAGES, n=3, max_tokens=512)
    assert [choice.index for choice in whole.choices] == [0, 1, 2]
    assert [(choice.message.content, choice.finish_reason) for choice in whole.choices] == [(text, finish)] * 3
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), 3 * tokens)
    chunks = list(
        client.chat.completions.create(
            model=model, messages=MESSAGES, n=3, max_tokens=512, stream=True, stream_options=USAGE
        )
    )
    roles = [choice.index for chunk in chunks for choice in chunk.choices if choice.delta.role == "assistant"]
    assert roles == [0, 1, 2]  # each choice's first chunk carries the role
    streamed = Streamed(chunks, "content")
    assert dict(streamed.texts) == {0: text, 1: text, 2: text}
    assert dict(streamed.finishes) == {0: [finish], 1: [finish], 2: [finish]}
    assert (streamed.usage.prompt_tokens, streamed.usage.completion_tokens) == (len(ids), 3 * tokens)


def test_n_is_limited(client: Any, model: str) -> None:
    for n in (0, 17):  # front.max_n = 16
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=model, prompt=PROMPT, n=n)
        assert refused.value.body["param"] == "n"


def test_echo_string_and_token_prompts(client: Any, model: str, tokenizer: Any) -> None:
    string_ids = tokenizer.encode(PROMPT, add_special_tokens=True).ids
    chat_ids = chat_prompt_ids(tokenizer, MESSAGES)  # holds special tokens: echoed as they are
    for prompt, ids, echoed in (
        (PROMPT, string_ids, PROMPT),
        (chat_ids, chat_ids, tokenizer.decode(chat_ids, skip_special_tokens=False)),
    ):
        text, finish, tokens = expected_echo(tokenizer, ids, 6)
        whole = client.completions.create(model=model, prompt=prompt, echo=True, n=2, max_tokens=6)
        assert [(choice.text, choice.finish_reason) for choice in whole.choices] == [(echoed + text, finish)] * 2
        assert whole.usage.completion_tokens == 2 * tokens
        streamed = Streamed(client.completions.create(model=model, prompt=prompt, echo=True, stream=True), "text")
        assert streamed.texts[0] == echoed + expected_echo(tokenizer, ids, 256)[0]
        alone = client.completions.create(model=model, prompt=prompt, echo=True, max_tokens=0)
        assert [(choice.text, choice.finish_reason) for choice in alone.choices] == [(echoed, "length")]
        assert (alone.usage.prompt_tokens, alone.usage.completion_tokens) == (len(ids), 0)
    chunks = client.completions.create(model=model, prompt=PROMPT, echo=True, max_tokens=0, n=2, stream=True)
    streamed = Streamed(chunks, "text")
    assert (dict(streamed.texts), dict(streamed.finishes)) == ({0: PROMPT, 1: PROMPT}, {0: ["length"], 1: ["length"]})


def test_continuous_usage_stats(client: Any, model: str, tokenizer: Any) -> None:
    prompt = PROMPT * 5  # ~100 tokens: many chunks
    ids = tokenizer.encode(prompt, add_special_tokens=True).ids
    _, _, tokens = expected_echo(tokenizer, ids, 512)
    options = {"include_usage": True, "continuous_usage_stats": True}
    for n in (1, 2):
        chunks = client.completions.create(model=model, prompt=prompt, n=n, stream=True, stream_options=options)
        streamed = Streamed(chunks, "text")
        assert set(streamed.running) == set(range(n))
        for running in streamed.running.values():  # vLLM: each chunk carries its choice's running counts
            assert all(usage.prompt_tokens == len(ids) for usage in running)
            assert all(usage.total_tokens == len(ids) + usage.completion_tokens for usage in running)
            counts = [usage.completion_tokens for usage in running]
            assert counts == sorted(counts) and counts[-1] == tokens and len(set(counts)) > 1
        final = sum(running[-1].completion_tokens for running in streamed.running.values())
        assert streamed.usage.completion_tokens == final == n * tokens
    alone = client.completions.create(  # without include_usage it does nothing (vLLM's rule)
        model=model, prompt=PROMPT, stream=True, stream_options={"continuous_usage_stats": True}
    )
    usages = [chunk.usage for chunk in alone]
    assert usages and all(usage is None for usage in usages)


def test_a_disconnect_aborts_every_choice(service: ServeProcess, model: str) -> None:
    before = service.stats()["front"].get("aborted", 0)
    body = {"model": model, "prompt": "tick " * 3000, "n": 3, "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", f"{service.url}/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # the stream has started; then the client goes away
    front = wait_for(lambda: (f := service.stats()["front"])["live_rids"] == 0 and f, 10, what="no live rids")
    assert front["aborted"] - before == 3
