"""logprobs end to end: a real `detok serve` (the echo source, whose fake logprobs are a pure function of the
output position and id: engine_stub/fake_logprobs.py) and the official `openai` client, chat and
completions, streamed and not. Token strings are the tokenizer's decode of each id, bytes the token's own bytes
(pieces of a character for tokens that split one), top candidates most likely first, one entry per completion token."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.grpc_engine_server import EngineServer
from helpers.serve_helpers import ServeProcess, serving

from engine_stub.fake_logprobs import fake_value

openai = pytest.importorskip("openai")

TEXT = "Jellyfish 🪼, family 👨‍👩‍👧, 今天的天气很好。"
MESSAGES = [{"role": "user", "content": TEXT}]


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving("--workers", "1", "--source", "echo", "--step-interval-ms", "2") as process:
        yield process


def api_client(service: ServeProcess) -> Any:
    return openai.OpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(service: ServeProcess) -> Iterator[Any]:
    with api_client(service) as api:
        yield api


def echoed(qwen3: Any, prompt_ids: list[int], count: int) -> list[int]:
    """The first `count` output ids of the echo source (the prompt, then EOS); the last is where it stopped."""
    output = [*prompt_ids, min(qwen3.eos_token_ids)]
    assert output[count - 1] in qwen3.eos_token_ids, "the output ends at the first EOS id"
    return output[:count]


def check_token_strings(tokens: list[str], ids: list[int], qwen3: Any) -> None:
    """vLLM's token strings: each id's decode alone, except that a piece of a character gives "" and the token that
    completes the character all of it; so they join into the text."""
    assert len(tokens) == len(ids)
    for token, token_id in zip(tokens, ids, strict=True):
        alone = qwen3.decode([token_id])
        assert token == alone if not alone.endswith("\ufffd") else "\ufffd" not in token
    assert "".join(tokens) == qwen3.decode(ids)
    assert "" in tokens, "a token that splits a character"


def as_float32(value: float) -> float:
    """A value as it comes through gRPC (protobuf `float`)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def check_values(
    ids: list[int], logprobs: list[float | None], tops: list[list[float]], top: int, precision: Any = float
) -> None:
    for position, (token_id, logprob, values) in enumerate(zip(ids, logprobs, tops, strict=True)):
        assert logprob == precision(fake_value(position, token_id))
        assert len(values) == top and values == sorted(values, reverse=True)


def streamed_logprobs(stream: Any) -> tuple[list[Any], Any]:
    """The `logprobs` of every streamed chunk that has them, and the usage chunk's usage."""
    pieces: list[Any] = []
    usage = None
    for chunk in stream:
        usage = chunk.usage if chunk.usage is not None else usage
        pieces += [choice.logprobs for choice in chunk.choices if choice.logprobs is not None]
    return pieces, usage


def model(client: Any) -> str:
    return client.models.list().data[0].id


def whole_completion(client: Any, qwen3: Any, precision: Any = float) -> Any:
    """A non-streamed completion echoing TEXT with logprobs=3, checked; returns it."""
    prompt = qwen3.encode(TEXT).ids
    whole = client.completions.create(model=model(client), prompt=prompt, max_tokens=100, logprobs=3)
    logprobs = whole.choices[0].logprobs
    count = whole.usage.completion_tokens
    ids = echoed(qwen3, prompt, count)
    check_token_strings(logprobs.tokens, ids, qwen3)
    assert logprobs.text_offset == [sum(len(token) for token in logprobs.tokens[:k]) for k in range(count)]
    # the sampled token first (OpenAI's legacy shape: up to logprobs + 1), then the candidates; the fake engine's
    # candidates include the sampled id, so there are `logprobs` of them
    assert [next(iter(candidates)) for candidates in logprobs.top_logprobs] == logprobs.tokens
    tops = [sorted(candidates.values(), reverse=True) for candidates in logprobs.top_logprobs]
    check_values(ids, logprobs.token_logprobs, tops, 3, precision)
    assert whole.choices[0].text == TEXT
    return whole


def test_completions(client: Any, qwen3: Any) -> None:
    whole = whole_completion(client, qwen3)
    prompt, logprobs, count = qwen3.encode(TEXT).ids, whole.choices[0].logprobs, whole.usage.completion_tokens

    stream = client.completions.create(
        model=model(client),
        prompt=prompt,
        max_tokens=100,
        logprobs=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = streamed_logprobs(stream)
    assert usage is not None and usage.completion_tokens == count
    tokens = [token for piece in pieces for token in piece.tokens]
    offsets = [offset for piece in pieces for offset in piece.text_offset]
    assert (tokens, offsets) == (logprobs.tokens, logprobs.text_offset)


def chat_ids(service: ServeProcess, qwen3: Any, count: int) -> list[int]:
    prompt = httpx.post(f"{service.url}/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    return echoed(qwen3, prompt, count)


def check_chat_entries(entries: list[Any], ids: list[int], qwen3: Any, top: int, precision: Any = float) -> None:
    check_token_strings([entry.token for entry in entries], ids, qwen3)
    joined = b"".join(bytes(entry.bytes) for entry in entries)
    assert joined.decode("utf-8") == qwen3.decode(ids)  # every token's own bytes, special tokens' text included
    pieces = {i for i, token_id in enumerate(ids) if qwen3.decode([token_id]).endswith("\ufffd")}
    partial = [entry for i, entry in enumerate(entries) if i in pieces]
    assert len(partial) >= 2, "the emoji split into byte-level tokens"
    for entry in partial:
        with pytest.raises(UnicodeDecodeError):
            bytes(entry.bytes).decode("utf-8")  # a piece of a character: its raw bytes, not U+FFFD's
    tops = [[candidate.logprob for candidate in entry.top_logprobs] for entry in entries]
    check_values(ids, [entry.logprob for entry in entries], tops, top, precision)
    for entry in entries:
        for candidate in entry.top_logprobs:
            try:
                assert bytes(candidate.bytes).decode("utf-8") == candidate.token
            except UnicodeDecodeError:
                assert "\ufffd" not in candidate.token  # a piece of a character: "" or the character it completes


def streamed_chat(client: Any) -> tuple[list[Any], int]:
    """A streamed chat with logprobs and top_logprobs=2: every chunk's entries, and usage.completion_tokens."""
    stream = client.chat.completions.create(
        model=model(client),
        messages=MESSAGES,
        max_tokens=100,
        logprobs=True,
        top_logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = streamed_logprobs(stream)
    assert usage is not None
    return [entry for piece in pieces for entry in piece.content], usage.completion_tokens


def test_chat(client: Any, service: ServeProcess, qwen3: Any) -> None:
    whole = client.chat.completions.create(
        model=model(client), messages=MESSAGES, max_tokens=100, logprobs=True, top_logprobs=2
    )
    count = whole.usage.completion_tokens
    ids = chat_ids(service, qwen3, count)
    entries = whole.choices[0].logprobs.content
    check_chat_entries(entries, ids, qwen3, 2)

    streamed, streamed_count = streamed_chat(client)
    assert streamed_count == count
    assert [entry.model_dump() for entry in streamed] == [entry.model_dump() for entry in entries]


def test_chat_logprobs_without_top(client: Any, service: ServeProcess, qwen3: Any) -> None:
    whole = client.chat.completions.create(model=model(client), messages=MESSAGES, max_tokens=100, logprobs=True)
    entries = whole.choices[0].logprobs.content
    check_chat_entries(entries, chat_ids(service, qwen3, whole.usage.completion_tokens), qwen3, 0)


def test_without_logprobs_none_come(client: Any) -> None:
    whole = client.chat.completions.create(model=model(client), messages=MESSAGES, max_tokens=5)
    assert whole.choices[0].logprobs is None
    completion = client.completions.create(model=model(client), prompt="Hello", max_tokens=5)
    assert completion.choices[0].logprobs is None


@pytest.mark.parametrize(
    ("endpoint", "extra", "param"),
    [
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("completions", {"logprobs": 21}, "logprobs"),
    ],
)
def test_limits_name_the_parameter(client: Any, endpoint: str, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        if endpoint == "chat":
            client.chat.completions.create(model=model(client), messages=MESSAGES, max_tokens=5, extra_body=extra)
        else:
            client.completions.create(model=model(client), prompt="Hello", max_tokens=5, extra_body=extra)
    assert caught.value.body["param"] == param


def refuses_prompt_logprobs(client: Any, source: str) -> None:
    """vLLM's prompt_logprobs: a 400 unsupported_parameter naming it, which says the vllm source honours it."""
    for create, body in (
        (client.completions.create, {"prompt": "Hello"}),
        (client.chat.completions.create, {"messages": MESSAGES}),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            create(model=model(client), max_tokens=5, extra_body={"prompt_logprobs": 1}, **body)
        error = caught.value.body
        assert (caught.value.status_code, error["param"], error["code"]) == (
            400,
            "prompt_logprobs",
            "unsupported_parameter",
        )
        assert "'vllm' engine source" in error["message"] and f"engine source '{source}'" in error["message"]


def test_a_local_source_refuses_prompt_logprobs(client: Any) -> None:
    refuses_prompt_logprobs(client, "echo")


def test_through_the_grpc_gateway(qwen3: Any) -> None:
    """`detok serve --source grpc` in front of `detok engine-server` (echo, fake logprobs in output_logprobs)."""
    engine = EngineServer("--source", "echo", "--step-interval-ms", "2")
    try:
        args = ("--workers", "1", "--source", "grpc", "--engine-url", engine.url)
        with serving(*args) as process, api_client(process) as client:
            whole_completion(client, qwen3, as_float32)
            entries, count = streamed_chat(client)
            check_chat_entries(entries, chat_ids(process, qwen3, count), qwen3, 2, as_float32)
            refuses_prompt_logprobs(client, "grpc")  # the token-only API's input_logprobs carry no ranks
    finally:
        engine.cleanup()


def test_each_of_n_choices_has_its_own_logprobs(client: Any, qwen3: Any) -> None:
    """n = 2 with logprobs: each choice's entries and text offsets are its own (the offsets restart per choice)."""
    prompt = qwen3.encode(TEXT).ids
    whole = client.completions.create(model=model(client), prompt=prompt, max_tokens=100, logprobs=2, n=2)
    per_choice = whole.usage.completion_tokens // 2
    ids = echoed(qwen3, prompt, per_choice)
    assert sorted(choice.index for choice in whole.choices) == [0, 1]
    for choice in whole.choices:
        check_token_strings(choice.logprobs.tokens, ids, qwen3)
        assert choice.logprobs.text_offset[0] == 0
    stream = client.completions.create(model=model(client), prompt=prompt, max_tokens=100, logprobs=2, n=2, stream=True)
    tokens: dict[int, list[str]] = {0: [], 1: []}
    offsets: dict[int, list[int]] = {0: [], 1: []}
    for chunk in stream:
        for choice in chunk.choices:
            if choice.logprobs is not None:
                tokens[choice.index] += choice.logprobs.tokens
                offsets[choice.index] += choice.logprobs.text_offset
    for index in (0, 1):
        assert tokens[index] == whole.choices[index].logprobs.tokens
        assert offsets[index] == whole.choices[index].logprobs.text_offset


def test_return_tokens_as_token_ids_writes_each_token_as_its_id(client: Any, qwen3: Any) -> None:
    """vLLM's return_tokens_as_token_ids: every token string (sampled and candidates) is "token_id:<id>";
    completions' text offsets count those strings; a chat token keeps its own bytes, a candidate's are its
    string's."""
    prompt = qwen3.encode(TEXT).ids
    extra = {"return_tokens_as_token_ids": True}
    completion = client.completions.create(
        model=model(client), prompt=prompt, max_tokens=12, logprobs=2, extra_body=extra
    )
    logprobs = completion.choices[0].logprobs
    ids = prompt[: len(logprobs.tokens)]  # the echo source's output: the prompt (12 of its ids)
    assert len(ids) == 12 and logprobs.tokens == [f"token_id:{token_id}" for token_id in ids]
    assert logprobs.text_offset == [sum(len(token) for token in logprobs.tokens[:i]) for i in range(len(ids))]
    for top in logprobs.top_logprobs:
        assert len(top) >= 2 and all(key.startswith("token_id:") and key[9:].isdigit() for key in top)

    def chat(**fields: Any) -> dict[str, Any]:
        body = {"messages": MESSAGES, "max_tokens": 12, "logprobs": True, "top_logprobs": 2, "return_token_ids": True}
        answer = httpx.post(f"{client.base_url}chat/completions", json={**body, **fields}, timeout=30)
        assert answer.status_code == 200, answer.text
        choice: dict[str, Any] = answer.json()["choices"][0]
        return choice

    as_ids, as_text = chat(**extra), chat()
    assert as_ids["token_ids"] == as_text["token_ids"] and as_ids["token_ids"]
    entries, plain = as_ids["logprobs"]["content"], as_text["logprobs"]["content"]
    assert [entry["token"] for entry in entries] == [f"token_id:{token_id}" for token_id in as_ids["token_ids"]]
    assert [entry["bytes"] for entry in entries] == [entry["bytes"] for entry in plain]  # the token's own bytes
    for entry in entries:
        assert len(entry["top_logprobs"]) == 2
        for top in entry["top_logprobs"]:
            assert top["token"].startswith("token_id:") and top["token"][9:].isdigit()
            assert top["bytes"] == list(top["token"].encode())
