"""End to end through a real `detok serve --workers 2 --source echo`: HTTP front, engine stub, two worker
processes, ipc sockets. The echo source generates the prompt's own ids (then EOS), so every expected text is
computable here from the tokenizer alone: decode of the generated ids, truncated by the stop rules."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.echo_source import chat_prompt_ids, expected_echo
from helpers.serve_helpers import ServeProcess, http_json, serving, wait_for

openai = pytest.importorskip("openai")

MESSAGES_TEXTS = [
    "Hello there! How are you today?",
    "日本語のテキストと中文文本，混在しています。",
    "Emoji: 😀👍🏽🇫🇷 family 👨‍👩‍👧‍👦 and keycap 1️⃣",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
    "Ünïcödé àccents, Ελληνικά, русский, עברית, العربية",
    "ไทย ภาษาไทย ไม่มีช่องว่าง and Hindi हिन्दी",
    "   leading and trailing spaces   \n\n\ttabs",
    "A " * 40,
]


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    usage: Any
    stop_reason: Any = None


@pytest.fixture(scope="module")
def service() -> Iterator[ServeProcess]:
    with serving(
        "--workers", "2", "--source", "echo", "--step-interval-ms", "2", "--set", "worker.stats_interval_s=0.1"
    ) as serve:
        yield serve


@pytest.fixture(scope="module")
def model(service: ServeProcess) -> str:
    status, body = http_json(f"{service.url}/v1/models")
    assert status == 200
    return body["data"][0]["id"]


async def stream_chat(client: Any, model: str, messages: list[dict[str, str]], **kwargs: Any) -> Completion:
    stream = await client.chat.completions.create(
        model=model, messages=messages, stream=True, stream_options={"include_usage": True}, **kwargs
    )
    parts: list[str] = []
    finish_reason = usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                parts.append(choice.delta.content)
            if choice.finish_reason is not None:
                finish_reason = choice.finish_reason
    return Completion("".join(parts), finish_reason, usage)


async def stream_completion(client: Any, model: str, prompt: str, **kwargs: Any) -> Completion:
    stream = await client.completions.create(
        model=model, prompt=prompt, stream=True, stream_options={"include_usage": True}, **kwargs
    )
    parts: list[str] = []
    finish_reason = usage = stop_reason = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.text or "")
            if choice.finish_reason is not None:
                finish_reason = choice.finish_reason
                stop_reason = getattr(choice, "stop_reason", None)
    return Completion("".join(parts), finish_reason, usage, stop_reason)


def client_for(service: ServeProcess) -> Any:
    return openai.AsyncOpenAI(base_url=f"{service.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_health_and_two_workers(service: ServeProcess) -> None:
    assert service.health() == 200
    workers = wait_for(
        lambda: len(service.stats()["workers"]) == 2 and service.stats()["workers"], 10, what="2 workers"
    )
    assert len({stats["pid"] for stats in workers.values()}) == 2
    assert len(service.child_pids("worker")) == 2


def test_50_concurrent_streaming_chats_are_exact(service: ServeProcess, tokenizer: Any, model: str) -> None:
    cases = []
    for index in range(50):
        text = MESSAGES_TEXTS[index % len(MESSAGES_TEXTS)]
        messages = [{"role": "user", "content": f"{index}: {text}"}]
        if index % 5 == 0:
            messages.insert(0, {"role": "system", "content": "Be brief. 简洁。"})
        max_tokens = 7 if index % 4 == 0 else 512  # some end by length, the rest by EOS
        cases.append((messages, max_tokens))

    async def run_all() -> list[Completion]:
        async with client_for(service) as client:
            return await asyncio.gather(*(stream_chat(client, model, m, max_tokens=n) for m, n in cases))

    results = asyncio.run(asyncio.wait_for(run_all(), 120))
    finish_reasons = set()
    for (messages, max_tokens), result in zip(cases, results, strict=True):
        prompt_ids = chat_prompt_ids(tokenizer, messages)
        text, finish_reason, completion_tokens = expected_echo(tokenizer, prompt_ids, max_tokens)
        assert result.text == text
        assert result.finish_reason == finish_reason
        assert result.usage.prompt_tokens == len(prompt_ids)
        assert result.usage.completion_tokens == completion_tokens
        finish_reasons.add(finish_reason)
    assert finish_reasons == {"stop", "length"}


def test_non_streaming_gives_the_streamed_text(service: ServeProcess, tokenizer: Any, model: str) -> None:
    async def both(messages: list[dict[str, str]], max_tokens: int) -> tuple[Completion, Any]:
        async with client_for(service) as client:
            streamed = await stream_chat(client, model, messages, max_tokens=max_tokens)
            whole = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens)
            return streamed, whole

    for index, text in enumerate(MESSAGES_TEXTS[:4]):
        messages = [{"role": "user", "content": text}]
        streamed, whole = asyncio.run(asyncio.wait_for(both(messages, 5 if index == 0 else 300), 60))
        assert whole.choices[0].message.content == streamed.text
        assert whole.choices[0].finish_reason == streamed.finish_reason
        assert whole.usage.completion_tokens == streamed.usage.completion_tokens
        assert whole.usage.prompt_tokens == streamed.usage.prompt_tokens


def test_completion_echo_round_trips_text(service: ServeProcess, tokenizer: Any, model: str) -> None:
    async def run_all() -> list[Completion]:
        async with client_for(service) as client:
            return await asyncio.gather(*(stream_completion(client, model, t, max_tokens=512) for t in MESSAGES_TEXTS))

    for prompt, result in zip(MESSAGES_TEXTS, asyncio.run(asyncio.wait_for(run_all(), 60)), strict=True):
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids
        assert result.text == tokenizer.decode(ids, skip_special_tokens=True)
        assert result.finish_reason == "stop"
        assert result.usage.completion_tokens == len(ids) + 1  # the EOS counts, as in vLLM


STOP_PROMPT = "The quick brown fox jumps over the lazy dog; 狐狸跳过了懒狗 😀👍 end of the story."


@pytest.mark.parametrize(
    "stop",
    [
        ["own fo"],  # splits " brown" | " fox"
        ["lazy dog;", "jumps"],  # the earliest match wins, not the first listed
        ["跳过了懒"],  # multi-byte, across tokens
        ["😀👍 e"],  # across an emoji's byte-level tokens
        ["not in the text"],
    ],
)
@pytest.mark.parametrize("visible", [False, True])
def test_stop_strings_over_http(service: ServeProcess, model: str, stop: list[str], visible: bool) -> None:
    async def run() -> Completion:
        async with client_for(service) as client:
            return await stream_completion(
                client,
                model,
                STOP_PROMPT,
                max_tokens=512,
                stop=stop,
                extra_body={"include_stop_str_in_output": visible},
            )

    result = asyncio.run(asyncio.wait_for(run(), 30))
    hits = [(STOP_PROMPT.find(s), s) for s in stop if s in STOP_PROMPT]
    if not hits:
        assert result.text == STOP_PROMPT
        assert result.finish_reason == "stop"
        return
    position, matched = min(hits)
    assert result.text == STOP_PROMPT[: position + (len(matched) if visible else 0)]
    assert result.finish_reason == "stop"
    if result.stop_reason is not None:
        assert result.stop_reason == matched


@pytest.mark.parametrize("visible", [False, True])
def test_stop_token_ids_over_http(service: ServeProcess, tokenizer: Any, model: str, visible: bool) -> None:
    ids = tokenizer.encode(STOP_PROMPT, add_special_tokens=True).ids
    stop_id = ids[5]

    async def run() -> Completion:
        async with client_for(service) as client:
            return await stream_completion(
                client,
                model,
                STOP_PROMPT,
                max_tokens=512,
                extra_body={"stop_token_ids": [stop_id], "include_stop_str_in_output": visible},
            )

    result = asyncio.run(asyncio.wait_for(run(), 30))
    assert result.text == tokenizer.decode(ids[: 6 if visible else 5], skip_special_tokens=True)
    assert result.finish_reason == "stop"
    assert result.usage.completion_tokens == 6


def test_live_rids_return_to_zero(service: ServeProcess) -> None:
    def idle() -> bool:
        stats = service.stats()
        return (
            stats["front"]["live_rids"] == 0
            and stats["engine"]["live_rids"] == 0
            and all(worker["live_rids"] == 0 for worker in stats["workers"].values())
        )

    wait_for(idle, 5, what="live rids back to 0 everywhere")


def test_bad_frames_are_counted_and_harmless(service: ServeProcess, model: str, tokenizer: Any) -> None:
    import msgspec
    import zmq

    from detok_worker.bus.messages import Hello, TextBatch

    before = service.stats()
    junk = [os.urandom(n) for n in (1, 7, 64, 1000)]
    junk += [b"", msgspec.msgpack.encode({"rid": 1}), msgspec.msgpack.encode(["submit", 42, "x"])]
    wrong_direction_for_front = [msgspec.msgpack.encode(Hello("intruder", 1))]
    wrong_direction_for_engine = [msgspec.msgpack.encode(TextBatch("w", 0, 0, []))]
    context = zmq.Context()
    try:
        for name, extra in (("front", wrong_direction_for_front), ("engine", wrong_direction_for_engine)):
            push = context.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 2000)
            push.connect(f"ipc://{service.runtime_dir}/{name}.sock")
            for frame in junk + extra:
                push.send(frame)
            push.send_multipart([b"two", b"parts"])
            push.close()
    finally:
        context.term()

    def bad_count(stats: dict[str, Any], part: str) -> int:
        return sum(stats[part].get("bad_frames", {}).values())

    wait_for(
        lambda: (
            bad_count(s := service.stats(), "engine") > bad_count(before, "engine")
            and bad_count(s, "front") > bad_count(before, "front")
        ),
        5,
        what="bad frames counted by the engine and the front",
    )
    assert service.health() == 200

    async def run() -> Completion:
        async with client_for(service) as client:
            return await stream_completion(client, model, "still alive?", max_tokens=64)

    assert asyncio.run(asyncio.wait_for(run(), 30)).text == "still alive?"


def test_tls_files_make_detok_serve_answer_https_only(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    with serving("--set", f"front.ssl_keyfile={key}", "--set", f"front.ssl_certfile={cert}") as process:
        assert process.url.startswith("https://")  # the supervisor's health probe went over TLS
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        answer = httpx.post(
            f"{process.url}/v1/completions", json={"prompt": "Hi there", "max_tokens": 3}, verify=context, timeout=30
        )
        plain = process.url.replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/health", timeout=5)
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"]
