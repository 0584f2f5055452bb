"""The HTTP front's OpenAI API against a test-played engine + worker over real ZMQ sockets: the official
`openai` client (streaming and not), raw SSE framing, usage, finish/stop reasons, offset dedup, prompt ids
(checked against transformers), /v1/models, /health, /stats."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.fault_helpers import Outcome, stream_completion
from helpers.fixtures import load_fixture_tokenizer
from helpers.front_harness import FrontUnderTest, decode_plan, running_front

from detok_worker.bus.messages import Submit, TextDelta
from detok_worker.front.app import INLINE_PROMPT_CHARS
from detok_worker.front.request_stream import RequestStream

openai = pytest.importorskip("openai")

PROMPTS = [
    "Hello there! How are you today?",
    "日本語のテキストと中文文本，混在しています。Emoji: 😀👍🏽🇫🇷 👨‍👩‍👧‍👦",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
]


@pytest.fixture(scope="module")
def front(tokenizer: Any) -> Iterator[FrontUnderTest]:
    with running_front(tokenizer) as under_test:
        yield under_test


@pytest.fixture(autouse=True)
def echo_by_default(front: FrontUnderTest) -> None:
    front.set_plan(front.echo_plan)


@pytest.fixture
def client(front: FrontUnderTest) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{front.url}/v1", api_key="unused", max_retries=0, timeout=30) as api:
        yield api


def last_submit(front: FrontUnderTest) -> Submit:
    submit = front.engine.submits.get(timeout=5)
    while not front.engine.submits.empty():
        submit = front.engine.submits.get_nowait()
    return submit


def test_models_health_stats(front: FrontUnderTest, tokenizer: Any, client: Any) -> None:
    models = client.models.list()
    assert [model.id for model in models.data] == [tokenizer.name]
    health = httpx.get(f"{front.url}/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    stats = httpx.get(f"{front.url}/stats").json()
    assert stats["front"]["live_rids"] == 0
    assert stats["engine"]["workers"] == {"played-worker": 0}
    assert "played-worker" in stats["workers"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_text_and_usage(front: FrontUnderTest, tokenizer: Any, client: Any, prompt: str) -> None:
    ids = tokenizer.encode(prompt, add_special_tokens=True).ids
    result = client.completions.create(model=tokenizer.name, prompt=prompt, max_tokens=50)
    assert result.choices[0].text == tokenizer.decode(ids, skip_special_tokens=True) == prompt
    assert result.choices[0].finish_reason == "length"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (len(ids), len(ids))
    assert result.id.startswith("cmpl-") and result.object == "text_completion"

    chunks = list(
        client.completions.create(
            model=tokenizer.name, prompt=prompt, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    assert text == prompt
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids)
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_token_id_prompt(front: FrontUnderTest, tokenizer: Any, client: Any) -> None:
    ids = tokenizer.encode(PROMPTS[1]).ids
    result = client.completions.create(model=tokenizer.name, prompt=ids)
    assert result.choices[0].text == PROMPTS[1]
    assert last_submit(front).prompt_ids == ids


@pytest.mark.parametrize("chars", [INLINE_PROMPT_CHARS, INLINE_PROMPT_CHARS + 1])
def test_prompt_ids_inline_and_off_loop(front: FrontUnderTest, tokenizer: Any, client: Any, chars: int) -> None:
    """A prompt up to INLINE_PROMPT_CHARS is tokenized on the loop, a longer one in a thread: same ids either way."""
    prompt = ("Count the words: " + " ".join(f"w{i}" for i in range(chars)))[:chars]
    client.completions.create(model=tokenizer.name, prompt=prompt, max_tokens=1)
    assert last_submit(front).prompt_ids == tokenizer.encode(prompt, add_special_tokens=True).ids


def test_chat_stream_and_whole(front: FrontUnderTest, tokenizer: Any, client: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[1]}]
    whole = client.chat.completions.create(model=tokenizer.name, messages=messages)
    prompt_ids = last_submit(front).prompt_ids
    expected = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    assert PROMPTS[1] in expected
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(prompt_ids) and whole.object == "chat.completion"

    chunks = list(client.chat.completions.create(model=tokenizer.name, messages=messages, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(chunk.object == "chat.completion.chunk" and chunk.id == chunks[0].id for chunk in chunks)


def test_request_params_reach_the_engine(front: FrontUnderTest, tokenizer: Any, client: Any) -> None:
    client.completions.create(
        model=tokenizer.name,
        prompt="x",
        max_tokens=7,
        stop=["END", "\n\n"],
        extra_body={
            "stop_token_ids": [13],
            "min_tokens": 2,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "ignore_eos": True,
        },
    )
    params = last_submit(front).params
    assert (params.max_tokens, params.ignore_eos) == (7, True)
    detok = params.detok
    assert (detok.stop, detok.stop_token_ids, detok.min_tokens) == (["END", "\n\n"], [13], 2)
    assert (detok.skip_special_tokens, detok.include_stop_str_in_output) == (False, True)

    client.chat.completions.create(
        model=tokenizer.name, messages=[{"role": "user", "content": "x"}], max_completion_tokens=9, stop="STOP"
    )
    params = last_submit(front).params
    assert (params.max_tokens, params.detok.stop, params.ignore_eos) == (9, ["STOP"], False)
    client.completions.create(model=tokenizer.name, prompt="x")
    assert last_submit(front).params.max_tokens == front.server.config.front.max_tokens_default


@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [(151645, None), ("END", "END"), (13, 13), (None, None)],
)
def test_stop_reason(front: FrontUnderTest, tokenizer: Any, stop_reason: Any, expected: Any) -> None:
    """Like vLLM: the matched stop string or stop token id; null when generation ended on EOS."""
    assert 151645 in tokenizer.eos_token_ids
    front.set_plan(
        lambda submit: decode_plan(tokenizer, submit.rid, submit.prompt_ids, finish="stop", stop_reason=stop_reason)
    )
    body = {"model": tokenizer.name, "prompt": "Hello world"}
    result = httpx.post(f"{front.url}/v1/completions", json=body, timeout=10).json()
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["choices"][0]["stop_reason"] == expected
    assert result["choices"][0]["text"] == "Hello world"


def test_sse_framing(front: FrontUnderTest, tokenizer: Any) -> None:
    body = {"model": tokenizer.name, "prompt": PROMPTS[0], "stream": True}
    with httpx.stream("POST", f"{front.url}/v1/completions", json=body, timeout=10) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode("utf-8")
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = []
    for event in events[:-2]:
        assert event.startswith("data: ") and "\n" not in event
        payloads.append(json.loads(event[len("data: ") :]))
    assert "".join(p["choices"][0]["text"] for p in payloads) == PROMPTS[0]
    assert all(p["object"] == "text_completion" and "usage" not in p for p in payloads)
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def resent_plan(tokenizer: Any, submit: Submit) -> list[TextDelta]:
    """A worker dies halfway; the re-opened rid's new worker re-sends everything from offset 0 in other chunks."""
    first = decode_plan(tokenizer, submit.rid, submit.prompt_ids)
    half = len(first) // 2
    again = decode_plan(tokenizer, submit.rid, submit.prompt_ids, tokens_per_delta=3)
    return first[:half] + again


def test_resent_offsets_are_delivered_once(front: FrontUnderTest, tokenizer: Any, client: Any) -> None:
    front.set_plan(lambda submit: resent_plan(tokenizer, submit))
    before = front.server.front.dispatcher.counters["duplicate_chars_dropped"]
    for prompt in PROMPTS:
        chunks = client.completions.create(model=tokenizer.name, prompt=prompt, stream=True)
        assert "".join(chunk.choices[0].text for chunk in chunks) == prompt
        whole = client.completions.create(model=tokenizer.name, prompt=prompt)
        assert whole.choices[0].text == prompt
    assert front.server.front.dispatcher.counters["duplicate_chars_dropped"] > before


def test_engine_abort_finish(front: FrontUnderTest, tokenizer: Any, client: Any) -> None:
    front.set_plan(lambda submit: decode_plan(tokenizer, submit.rid, submit.prompt_ids, finish="abort"))
    result = client.completions.create(model=tokenizer.name, prompt="Hello world")
    assert (result.choices[0].text, result.choices[0].finish_reason) == ("Hello world", "abort")


def test_prompt_ids_match_transformers(tmp_path: Any) -> None:
    """Chat: template with add_generation_prompt, encoded without special tokens; completions: encoded with them
    (BOS on DeepSeek-V3). The reference is transformers on the same files."""
    transformers = pytest.importorskip("transformers")
    from helpers.chat_conversations import unpack_tokenizer_dir

    directory = unpack_tokenizer_dir("deepseek-v3", tmp_path)
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    tokenizer = load_fixture_tokenizer("deepseek-v3")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi 😀"}]
    with (
        running_front(tokenizer) as front,
        openai.OpenAI(base_url=f"{front.url}/v1", api_key="x", max_retries=0) as client,
    ):
        client.chat.completions.create(model=tokenizer.name, messages=messages)
        expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert last_submit(front).prompt_ids == list(expected)
        client.completions.create(model=tokenizer.name, prompt="Hi 😀")
        assert last_submit(front).prompt_ids == reference("Hi 😀")["input_ids"]


def test_encode_cache_serves_repeated_prompts(tokenizer: Any) -> None:
    system = {"role": "system", "content": "You are a support agent for ACME. " * 20}
    conversations = [[system, {"role": "user", "content": f"Question {i}: where is my order? 📦"}] for i in range(3)]
    overrides = {"tokenizer.cache.enable_l0": True, "tokenizer.cache.enable_l1": True}
    with (
        running_front(tokenizer, **overrides) as front,
        openai.OpenAI(base_url=f"{front.url}/v1", api_key="x", max_retries=0) as client,
    ):
        front.set_plan(lambda submit: decode_plan(tokenizer, submit.rid, submit.prompt_ids[-3:]))
        for messages in conversations + conversations:
            client.chat.completions.create(model=tokenizer.name, messages=messages)
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            assert last_submit(front).prompt_ids == tokenizer.encode(text).ids
        cache = httpx.get(f"{front.url}/stats").json()["front"]["encode_cache"]
    assert cache["l0"]["hits"] >= len(conversations)


def test_a_failure_on_one_streams_output_ends_only_that_stream(
    front: FrontUnderTest, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taking a delta into one request's stream raises (a bug of the front's, played here for the request whose
    request_id says so): that request ends with an error event, the others' texts are whole."""

    def failing_for_the_poisoned(real: Any) -> Any:
        def take(stream: RequestStream, *args: Any) -> Any:
            if "poisoned" in stream.rid:
                raise RuntimeError("a front bug")
            return real(stream, *args)

        return take

    monkeypatch.setattr(RequestStream, "accept_text", failing_for_the_poisoned(RequestStream.accept_text))
    monkeypatch.setattr(RequestStream, "accept", failing_for_the_poisoned(RequestStream.accept))
    bodies = [{"model": tokenizer.name, "prompt": prompt, "max_tokens": 64} for prompt in PROMPTS]
    bodies[1]["request_id"] = "poisoned"

    async def run() -> list[Outcome]:
        async with httpx.AsyncClient(base_url=front.url, timeout=10) as http:
            return await asyncio.gather(*(stream_completion(http, body) for body in bodies))

    first, poisoned, last = asyncio.run(run())
    assert (first.text, first.error, last.text, last.error) == (PROMPTS[0], None, PROMPTS[2], None)
    assert poisoned.done and poisoned.error is not None
    assert poisoned.error["message"] == "the server failed on this request's output: a front bug"
    assert poisoned.error["type"] == "server_error"
