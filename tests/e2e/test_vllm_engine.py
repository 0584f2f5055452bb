"""`detok serve --source vllm` on a real vLLM engine on CPU (random weights, the embedded Qwen3 tokenizer), next to
vLLM's own OpenAI server on the same model and engine flags. Every text is checked against the Qwen3 full decode
of the ids the engine produced (the engine's own trace of what it sent the workers), truncated by the request's
stop rule."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.fault_helpers import (
    Outcome,
    bounded,
    http_client,
    rss_kb,
    service_pids,
    stalled_stream,
    stream_completion,
)
from helpers.serve_helpers import ServeProcess, children_of, pid_alive, wait_for
from helpers.tokenizer_files import reference_hf_tokenizer
from helpers.vllm_cpu import MAX_MODEL_LEN, SERVED_NAME, VllmServer, detok_vllm

from detok_worker.trace.format import read_trace

pytestmark = pytest.mark.timeout(900)  # each engine start is ~30-60 s here, much longer on a loaded machine

EOS_IDS = {151643, 151645}  # the model's generation config: the engine stops at either
PARTIAL_CHARACTER = [9707, 20741]  # "Hello", then the first bytes of a character that never completes


@pytest.fixture(scope="module")
def qwen3():
    """The reference decode: HF `tokenizers` on the Qwen3 files (an id the model has and the tokenizer lacks
    decodes to nothing there, as in vLLM)."""
    return reference_hf_tokenizer("qwen3")


@pytest.fixture(scope="module")
def trace_path() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="detok-vllm-trace-"))
    yield directory / "engine.trace"


def seeded(seed: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A completion whose ids are fixed by its seed: temperature 1 on random weights gives varied ids (CJK, emoji
    bytes, code)."""
    return {"prompt": f"Story number {seed}:", "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, **extra}


REFERENCE_CASES = [seeded(seed, 32) for seed in (1, 2, 3, 4)] + [
    {"prompt": PARTIAL_CHARACTER[:1], "max_tokens": 1, "logit_bias": {str(PARTIAL_CHARACTER[1]): 100}},
]


# sampled logprobs: seeded completions of random ids (pieces of characters among them) whose token strings, text
# offsets and top candidates vLLM's server gives; with echo, the prompt's tokens lead them (from prompt logprobs)
LOGPROBS_CASES = [seeded(seed, 64, logprobs=2) for seed in (11, 12, 13)] + [
    {"prompt": "Story 龘 number 😀 five", "max_tokens": 8, "temperature": 1.0, "seed": 14, "logprobs": 3, "echo": True},
    {"prompt": "Two choices", "max_tokens": 4, "seed": 5, "logprobs": 1, "echo": True, "prompt_logprobs": 2},
]

# prompt_logprobs requests (path, body): a prompt with a character split over three tokens, the whole vocabulary's
# top candidates as vLLM caps them, chat, echo, n = 2; and what vLLM's server refuses (a stream with k > 0)
PROMPT_LOGPROBS_CASES = [
    ("/v1/completions", {"prompt": "Story 龘 number 😀 five", "max_tokens": 2, "prompt_logprobs": 3}),
    ("/v1/completions", {"prompt": [9707, 11, 1879], "max_tokens": 1, "prompt_logprobs": 0, "echo": True}),
    ("/v1/completions", {"prompt": "Two choices", "max_tokens": 2, "n": 2, "seed": 5, "prompt_logprobs": 20}),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Hi 龘"}], "max_tokens": 2, "prompt_logprobs": 2},
    ),
    ("/v1/completions", {"prompt": "Streamed", "max_tokens": 2, "stream": True, "prompt_logprobs": 1}),
    ("/v1/completions", {"prompt": "Too many", "max_tokens": 2, "prompt_logprobs": 21}),  # over --max-logprobs (20)
]


def prompt_logprobs_answer(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The status, and where 200 the prompt_logprobs of each choice (chat: of the response) and the texts."""
    response = client.post(path, json={**body, "model": SERVED_NAME})
    if response.status_code != 200:
        return {"status": response.status_code, "param": response.json()["error"].get("param")}
    answer = response.json()
    choices = answer["choices"]
    texts = [choice["message"]["content"] if "message" in choice else choice["text"] for choice in choices]
    if path == "/v1/chat/completions":
        return {"status": 200, "entries": [answer["prompt_logprobs"]], "texts": texts}
    return {"status": 200, "entries": [choice["prompt_logprobs"] for choice in choices], "texts": texts}


@pytest.fixture(scope="module")
def vllm_reference(reference_vllm: VllmServer) -> dict[str, list[dict[str, Any]]]:
    """vLLM's own server's answers to REFERENCE_CASES (one at a time: a batch of one samples the same ids in both),
    with the ids it generated; and to PROMPT_LOGPROBS_CASES."""
    answers = []
    with httpx.Client(base_url=reference_vllm.url, timeout=120) as client:
        for case in REFERENCE_CASES:
            response = client.post("/v1/completions", json={**case, "model": SERVED_NAME, "return_token_ids": True})
            assert response.status_code == 200, response.text
            choice = response.json()["choices"][0]
            answers.append({"text": choice["text"], "ids": choice["token_ids"], "finish": choice["finish_reason"]})
        prompt_logprobs = [prompt_logprobs_answer(client, path, body) for path, body in PROMPT_LOGPROBS_CASES]
        logprobs = [sampled_logprobs(client, case) for case in LOGPROBS_CASES]
    return {"completions": answers, "prompt_logprobs": prompt_logprobs, "logprobs": logprobs}


def sampled_logprobs(client: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """A completion's text and logprobs: tokens, text offsets, and the top candidates' token strings."""
    response = client.post("/v1/completions", json={**body, "model": SERVED_NAME})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    logprobs = choice["logprobs"]
    tops = [sorted(candidates) if candidates is not None else None for candidates in logprobs["top_logprobs"]]
    return {
        "text": choice["text"],
        "tokens": logprobs["tokens"],
        "offsets": logprobs["text_offset"],
        "tops": tops,
        "nulls": [i for i, value in enumerate(logprobs["token_logprobs"]) if value is None],
        "prompt_logprobs": choice.get("prompt_logprobs") is not None,
    }


@pytest.fixture(scope="module")
def service(vllm_reference: dict[str, list[dict[str, Any]]], trace_path: Path) -> Iterator[ServeProcess]:
    """One detok serve --source vllm for the module (started once vLLM's own server has answered: it idles
    meanwhile). The last test kills its engine core."""
    # frames up to 256 KiB (every request here fits): prompt logprobs that would not fit are refused
    with detok_vllm(
        "--record", str(trace_path), "--set", "engine.stats_interval_s=0.1", "--set", "bus.max_message_bytes=262144"
    ) as process:
        yield process


def recorded_ids(trace_path: Path, request_id: str) -> list[int]:
    """The ids the engine sent the workers for the request with this client request_id."""
    prefix = f"cmpl-{request_id}-"
    found = [request for request in read_trace(trace_path).requests if request.rid.startswith(prefix)]
    assert len(found) == 1, (request_id, [request.rid for request in found])
    return found[0].output_ids


def expected_text(tokenizer: Any, ids: list[int], stop: list[str], include_stop: bool) -> str:
    """The full decode of the ids up to the first EOS, truncated at the stop string match that ends first."""
    cut = next((i for i, token_id in enumerate(ids) if token_id in EOS_IDS), len(ids))
    text = tokenizer.decode(ids[:cut], skip_special_tokens=True)
    matches = [(text.find(s) + len(s), text.find(s)) for s in stop if s in text]
    if not matches:
        return text
    end, start = min(matches)
    return text[:end] if include_stop else text[:start]


async def stream_many(service: ServeProcess, bodies: list[dict[str, Any]]) -> list[Outcome]:
    async with http_client(service) as client:
        return await asyncio.gather(*(bounded(stream_completion(client, body), 120) for body in bodies))


def test_seeded_completions_equal_vllms_own_server_and_the_full_decode(
    service: ServeProcess, vllm_reference: dict[str, list[dict[str, Any]]], qwen3: Any
) -> None:
    async def run() -> list[Outcome]:
        async with http_client(service) as client:
            return [await stream_completion(client, {**case, "model": SERVED_NAME}) for case in REFERENCE_CASES]

    outcomes = asyncio.run(run())
    references = vllm_reference["completions"]
    for case, outcome, reference in zip(REFERENCE_CASES[:-1], outcomes, references, strict=False):
        assert outcome.status == 200 and outcome.error is None and outcome.done, (case, outcome)
        assert outcome.text == reference["text"] == qwen3.decode(reference["ids"]), (case, outcome, reference)
        assert outcome.finish_reason == reference["finish"]
    # the output ends inside a character: the full decode ends with U+FFFD, and so does detok's text; vLLM's server
    # drops the unfinished character
    partial, reference = outcomes[-1], references[-1]
    assert reference["ids"] == PARTIAL_CHARACTER[1:]
    full = qwen3.decode(PARTIAL_CHARACTER)
    assert full.endswith("\ufffd")
    assert partial.text == full[len(qwen3.decode(PARTIAL_CHARACTER[:1])) :] == "\ufffd"
    assert reference["text"] == ""


def test_50_concurrent_streams_with_hidden_and_visible_stops_equal_the_full_decode(
    service: ServeProcess, trace_path: Path, qwen3: Any
) -> None:
    """A first pass learns each seed's text; the second asks again with a stop string taken from the middle of that
    text (hidden for half, visible for the other half; some with one that never matches): the same seed gives the
    same ids up to the stop."""
    rng = random.Random(26)
    first = asyncio.run(stream_many(service, [seeded(100 + i, 40, request_id=f"a{i}") for i in range(50)]))
    bodies = []
    for i, outcome in enumerate(first):
        assert outcome.status == 200 and outcome.error is None and outcome.done, outcome
        stop = ["§never§"] if i % 7 == 0 else []
        text = outcome.text
        if len(text) > 12 and i % 7:
            start = rng.randrange(len(text) // 3, len(text) - 4)
            stop.append(text[start : start + rng.randint(2, 4)])
        bodies.append(seeded(100 + i, 40, request_id=f"b{i}", stop=stop, include_stop_str_in_output=i % 2 == 1))
    second = asyncio.run(stream_many(service, bodies))
    time.sleep(0.3)  # the trace is flushed at each engine stats report (every 0.1 s here)
    stopped = 0
    for i, (body, outcome) in enumerate(zip(bodies, second, strict=True)):
        assert outcome.status == 200 and outcome.error is None and outcome.done, (body, outcome)
        first_ids = recorded_ids(trace_path, f"a{i}")
        assert first[i].text == expected_text(qwen3, first_ids, [], False)
        ids = recorded_ids(trace_path, f"b{i}")
        expected = expected_text(qwen3, ids, body["stop"], body["include_stop_str_in_output"])
        assert outcome.text == expected, (body, ids)
        if outcome.finish_reason == "stop" and not set(ids) & EOS_IDS:
            stopped += 1
            assert len(ids) <= len(first_ids)
    assert stopped >= 30  # most stop strings were met, mid-stream


def test_a_burst_of_600_requests_is_served_whole_and_loses_no_worker(
    service: ServeProcess, trace_path: Path, qwen3: Any
) -> None:
    """600 requests at once: their Submits go through vLLM's input processing one by one (about a millisecond
    each), longer than the workers' heartbeat timeout; the engine loop takes them in slices and reads the bus in
    between, so no worker is declared lost, the fronts keep the engine's stats, and every request is served."""
    before = service.stats()["engine"]
    bodies = [seeded(5000 + i, 3, request_id=f"burst{i}") for i in range(600)]

    async def run() -> list[Outcome]:
        async with http_client(service, connections=600) as client:
            return await asyncio.gather(*(bounded(stream_completion(client, body), 120) for body in bodies))

    outcomes = asyncio.run(run())
    time.sleep(0.3)
    for body, outcome in zip(bodies, outcomes, strict=True):
        assert outcome.status == 200 and outcome.error is None and outcome.done, (body, outcome)
        assert outcome.text == expected_text(qwen3, recorded_ids(trace_path, body["request_id"]), [], False)
    after = service.stats()["engine"]
    assert after["reopened"] == before["reopened"] and after["workers"].keys() == before["workers"].keys(), after


def generated(service: ServeProcess) -> int:
    """Ids the engine core has produced since the start (the engine's stats, every 0.1 s here)."""
    return service.stats()["engine"]["generated"]


def settled_generated(service: ServeProcess, since: float) -> tuple[int, float]:
    """(the engine's generated count once it has not grown for a second, when it last grew)."""
    last, last_change, stable_since = generated(service), since, time.monotonic()
    while time.monotonic() - stable_since < 1.0:
        time.sleep(0.05)
        now = generated(service)
        if now != last:
            last, last_change, stable_since = now, time.monotonic(), time.monotonic()
    return last, last_change


def test_a_stop_string_found_by_a_worker_aborts_the_request_in_the_engine(service: ServeProcess) -> None:
    """Without the abort the engine core would generate the request's 1500 ids (about 11 s here); with it, the ids
    stop soon after the stop string: a step or two on an idle machine, more when the 2 cores are shared (the bound
    leaves room for a worker or the engine loop starved for a couple of seconds, and is still far from 1500)."""
    (first,) = asyncio.run(stream_many(service, [seeded(7, 24)]))
    assert first.status == 200 and first.error is None and len(first.text) > 12, first
    stop = first.text[len(first.text) // 2 : len(first.text) // 2 + 3]
    before = generated(service)
    (stopped,) = asyncio.run(stream_many(service, [seeded(7, 1500, stop=[stop])]))
    assert stopped.finish_reason == "stop" and stopped.text == first.text[: first.text.find(stop)], stopped
    after, _ = settled_generated(service, time.monotonic())
    assert after - before < 400, f"{after - before} ids generated for a request stopped at id ~12"


def test_a_client_that_leaves_is_aborted_in_the_engine_within_a_second(service: ServeProcess) -> None:
    """The engine stops generating for the request within a second of the client leaving, well before its
    max_tokens (how many ids fit in that second depends only on the engine's speed)."""
    max_tokens = MAX_MODEL_LEN - 16
    events_at: list[tuple[float, int]] = []  # (seconds since the request, the engine's generated count then)

    async def leave_after_three_events() -> float:
        async with http_client(service) as client:
            body = {**seeded(8, max_tokens), "stream": True}
            started = time.monotonic()
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events_at.append((round(time.monotonic() - started, 3), generated(service) - before))
                        if len(events_at) == 3:
                            break
            return time.monotonic()  # the connection is closed here

    before, _ = settled_generated(service, time.monotonic())  # no earlier test's request still generating
    left_at = asyncio.run(leave_after_three_events())
    after, last_change = settled_generated(service, left_at)
    seen = f"events at (s, ids generated): {events_at}; {after - before} ids in all"
    assert last_change - left_at < 1.0, f"the engine went on for {last_change - left_at:.2f} s; {seen}"
    assert after - before < max_tokens, f"the request ran to its length; {seen}\n{service.log()}"


def engine_step_s(service: ServeProcess, running: int) -> float:
    """How long one engine step takes now, with `running` sequences in each (the model on 2 CPU cores with
    hundreds of sequences takes about half a second): from the engine's generated count over 2 s."""
    first, started = generated(service), time.monotonic()
    time.sleep(2.0)
    made = generated(service) - first
    return running * (time.monotonic() - started) / max(made, 1)


def test_clients_that_never_read_do_not_hold_back_a_normal_client(service: ServeProcess, trace_path: Path) -> None:
    """The normal client's first token comes within 1 s, or within three engine steps where one step of the 300
    stalled sequences is longer than a third of that on this machine: it waits for no stalled client, only for
    the engine to schedule it (the step running when it arrives, then its own prefill step)."""
    # long enough that the first stalled requests are still generating when the last one is admitted
    stalled = [stalled_stream(service, {**seeded(1000 + i, 512), "stream": True}) for i in range(300)]
    try:
        seen: list[dict[str, Any]] = []

        def all_on_the_engine() -> bool:
            seen[:] = [service.stats()]
            return seen[0]["engine"]["live_rids"] >= 300

        try:
            wait_for(all_on_the_engine, 60, what="300 stalled streams on the engine")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last /stats: {seen}; log tail: {service.log(3000)}") from None
        step_s = engine_step_s(service, 300)
        arrivals: list[float] = []

        async def normal() -> tuple[Outcome, float]:
            async with http_client(service) as client:
                sent = time.monotonic()
                body = seeded(2000, 32, request_id="normal")
                return await bounded(stream_completion(client, body, arrivals), 60), sent

        outcome, sent = asyncio.run(normal())
        assert outcome.status == 200 and outcome.error is None and outcome.done, outcome
        assert arrivals[0] - sent < max(1.0, 3 * step_s), (arrivals[0] - sent, step_s)
        time.sleep(0.3)
        ids = recorded_ids(trace_path, "normal")
        assert outcome.text == expected_text(reference_hf_tokenizer("qwen3"), ids, [], False)
        # what the stalled streams hold stays in the front's bounded per-request buffers
        total_kb = sum(rss_kb(pid) for role, pid in service_pids(service).items() if role != "engine")
        assert total_kb < 900_000, service_pids(service)  # vLLM's environment imports more per process
    finally:
        for sock in stalled:
            sock.close()
    wait_for(lambda: service.stats()["engine"]["live_rids"] == 0, 60, what="the stalled streams to end")


def test_a_killed_worker_loses_no_text(service: ServeProcess, trace_path: Path, qwen3: Any) -> None:
    """Nor an id: half the requests ask for their token ids, which the new worker replays from the first."""
    bodies = [seeded(3000 + i, 120, request_id=f"k{i}", return_token_ids=i % 2 == 0) for i in range(20)]

    async def run() -> list[Outcome]:
        async with http_client(service) as client:
            streams = [asyncio.create_task(bounded(stream_completion(client, body), 120)) for body in bodies]
            await asyncio.sleep(1.0)
            os.kill(service.child_pids("worker")[0], signal.SIGKILL)
            return await asyncio.gather(*streams)

    outcomes = asyncio.run(run())
    time.sleep(0.3)
    for body, outcome in zip(bodies, outcomes, strict=True):
        assert outcome.status == 200 and outcome.error is None and outcome.done, (body, outcome)
        ids = recorded_ids(trace_path, body["request_id"])
        assert outcome.text == expected_text(qwen3, ids, [], False), body
        assert outcome.token_ids == (ids if body["return_token_ids"] else None), body


def test_logprobs_token_strings_are_vllms(service: ServeProcess, vllm_reference: dict[str, Any]) -> None:
    """Each sampled token's string (a piece of a character: "" until the token that completes it), the text offsets
    and the top candidates' strings are those of vLLM's own server for the same seeded request; with echo, the
    prompt's tokens lead them, the first with null values (vLLM asks its engine for the prompt's logprobs)."""
    with httpx.Client(base_url=service.url, timeout=120) as client:
        answers = [sampled_logprobs(client, case) for case in LOGPROBS_CASES]
    for answer, reference in zip(answers, vllm_reference["logprobs"], strict=True):
        assert answer["tokens"] == reference["tokens"]
        assert answer["offsets"] == reference["offsets"]
        assert answer["tops"] == reference["tops"]
        assert (answer["nulls"], answer["prompt_logprobs"]) == (reference["nulls"], reference["prompt_logprobs"])
    echoed = vllm_reference["logprobs"][3]
    assert echoed["nulls"] == [0] and echoed["prompt_logprobs"] and echoed["text"].startswith("Story 龘 number")
    assert any("" in reference["tokens"] for reference in vllm_reference["logprobs"]), "no split character seen"


def same_prompt_logprobs(answer: dict[str, Any], reference: dict[str, Any]) -> None:
    """detok's answer is vLLM's server's: the status (and the refused field), else per choice the entries: the ids in
    order, their ranks and decoded tokens, the logprobs within float tolerance."""
    assert answer.keys() == reference.keys() and answer["status"] == reference["status"], (answer, reference)
    if answer["status"] != 200:
        assert answer["param"] == "prompt_logprobs", answer
        return
    assert len(answer["entries"]) == len(reference["entries"])
    for entries, expected in zip(answer["entries"], reference["entries"], strict=True):
        assert len(entries) == len(expected) > 1 and entries[0] is None is expected[0]
        for position, (entry, wanted) in enumerate(zip(entries[1:], expected[1:], strict=True), 1):
            assert list(entry) == list(wanted), position
            for token_id, value in entry.items():
                other = wanted[token_id]
                assert (value["rank"], value["decoded_token"]) == (other["rank"], other["decoded_token"]), position
                assert value["logprob"] == pytest.approx(other["logprob"], abs=1e-3), (position, token_id)


def test_vllm_request_fields(
    service: ServeProcess, qwen3: Any, vllm_reference: dict[str, list[dict[str, Any]]]
) -> None:
    """return_token_ids gives the ids the engine generated (their full decode is the text), streamed the same;
    allowed_token_ids and bad_words reach vLLM's sampler (only the allowed ids, never a banned word's); priority and
    cache_salt are taken by vLLM's engine core; prompt_logprobs are vLLM's server's (and refused where it refuses
    them). The model card gives vLLM's context length (--max-model-len)."""
    with httpx.Client(base_url=service.url, timeout=120) as client:
        cards = client.get("/v1/models").json()["data"]
        assert [(card["id"], card["max_model_len"]) for card in cards] == [(SERVED_NAME, MAX_MODEL_LEN)]
        body = {**seeded(11, 24), "model": SERVED_NAME, "return_token_ids": True, "request_id": "ids"}
        whole = client.post("/v1/completions", json=body)
        assert whole.status_code == 200, whole.text
        choice = whole.json()["choices"][0]
        assert choice["prompt_token_ids"] == qwen3.encode(body["prompt"]).ids
        assert len(choice["token_ids"]) == 24 or choice["token_ids"][-1] in EOS_IDS
        assert qwen3.decode(choice["token_ids"]) == choice["text"]
        streamed = client.post("/v1/completions", json={**body, "stream": True, "request_id": "ids-stream"})
        chunks = [json.loads(line[6:]) for line in streamed.text.split("\n\n") if line.startswith("data: {")]
        assert sum((chunk["choices"][0]["token_ids"] for chunk in chunks), []) == choice["token_ids"]
        assert "".join(chunk["choices"][0]["text"] for chunk in chunks) == choice["text"]

        allowed = [qwen3.encode(word).ids[0] for word in ("yes", "no", " maybe")]
        body = {**seeded(12, 16), "model": SERVED_NAME, "return_token_ids": True, "allowed_token_ids": allowed}
        answer = client.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        ids = answer.json()["choices"][0]["token_ids"]
        assert len(ids) == 16 and set(ids) <= set(allowed)  # no EOS either: it is not allowed
        banned = client.post("/v1/completions", json={**body, "bad_words": ["yes", "maybe"]})
        assert banned.status_code == 200, banned.text
        assert banned.json()["choices"][0]["token_ids"] == [allowed[1]] * 16  # "no" is all that is left

        extra = {"priority": -3, "cache_salt": "tenant-7", "bad_words": ["the"]}
        accepted = client.post("/v1/completions", json={**seeded(13, 8), "model": SERVED_NAME, **extra})
        assert accepted.status_code == 200 and accepted.json()["usage"]["completion_tokens"] > 0, accepted.text
        chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        refused = client.post("/v1/completions", json={**seeded(14, 4), "model": SERVED_NAME, "cache_salt": "a/b"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "cache_salt"

        answers = [prompt_logprobs_answer(client, path, body) for path, body in PROMPT_LOGPROBS_CASES]
        for answer, reference in zip(answers, vllm_reference["prompt_logprobs"], strict=True):
            same_prompt_logprobs(answer, reference)
        split, echoed, two = answers[:3]
        # " 龘" is three tokens (prompt positions 1-3): the last one completes it and gives it whole
        prompt_tokens = [entry[next(iter(entry))]["decoded_token"] for entry in split["entries"][0][1:]]
        assert prompt_tokens == ["", "", " 龘", " number", " 😀", " five"]
        assert echoed["texts"][0].startswith(qwen3.decode([9707, 11, 1879]))
        assert len(two["entries"]) == 2 and two["entries"][0] == two["entries"][1]
        assert len(two["entries"][0][1]) == 21  # the prompt token and its 20 top candidates (it is not among them)
        # 900 prompt tokens x 21 entries do not fit in a 256 KiB frame: refused, and the engine serves on
        long_prompt = {"prompt": [9707] * 900, "max_tokens": 2, "prompt_logprobs": 20}
        assert prompt_logprobs_answer(client, "/v1/completions", long_prompt) == {
            "status": 400,
            "param": "prompt_logprobs",
        }
        same_prompt_logprobs(prompt_logprobs_answer(client, *PROMPT_LOGPROBS_CASES[0]), answers[0])


def engine_core_pids(service: ServeProcess) -> list[int]:
    """vLLM's engine core processes under detok's engine process, each followed by its own children (the model
    worker): killed together, nothing of the old engine can produce a token."""
    pids = []
    for engine in service.child_pids("engine"):
        for core, cmdline in children_of(engine).items():
            if "EngineCore" in cmdline:
                pids += [core, *children_of(core)]
    return pids


def test_killing_the_engine_core_ends_every_stream_with_an_error_within_a_second(service: ServeProcess) -> None:
    """The module's last test (it ends the shared service). A request the engine core finished before the kill
    ends whole: on a loaded host the client can be off the CPU for seconds between its requests and its reads,
    while the engine core runs the first request alone to its length. Every other stream ends with the error, and
    at least one does."""

    # as long as the context allows: on a loaded host the first streams run seconds before the last starts
    longest = MAX_MODEL_LEN - 64

    async def run() -> tuple[list[Outcome], float]:
        async with http_client(service) as client:
            arrivals: list[list[float]] = [[] for _ in range(8)]
            usage = {"stream_options": {"include_usage": True}}
            streams = [
                asyncio.create_task(bounded(stream_completion(client, seeded(i, longest, **usage), arrivals[i]), 60))
                for i in range(8)
            ]
            deadline = time.monotonic() + 30
            while not all(arrivals) and time.monotonic() < deadline:  # every stream is generating
                await asyncio.sleep(0.05)
            assert all(arrivals), [len(times) for times in arrivals]
            ended = [stream.result() for stream in streams if stream.done()]
            assert not ended, ("a stream ended before the engine core was killed", ended)
            cores = engine_core_pids(service)
            assert cores, service.children()
            killed_at = time.monotonic()
            for pid in cores:
                os.kill(pid, signal.SIGKILL)
            assert wait_for(lambda: not any(map(pid_alive, cores)), 5, what="the engine core gone")
            return await asyncio.gather(*streams), killed_at

    outcomes, killed_at = asyncio.run(run())
    failed = [outcome for outcome in outcomes if outcome.error is not None]
    assert failed, (outcomes, service.log())
    for outcome in outcomes:
        if outcome.error is None:  # finished on the engine core before the kill: its whole length
            whole = (outcome.status, outcome.finish_reason, outcome.completion_tokens, outcome.done)
            assert whole == (200, "length", longest, True), (outcome, service.log())
            continue
        assert outcome.status == 200, (outcome, service.log())
        assert "vLLM engine core" in outcome.error["message"]
        assert outcome.error_at is not None and outcome.error_at - killed_at < 1.0
    assert wait_for(lambda: service.proc.poll() is not None, 60, what="detok serve exiting")
    assert service.proc.returncode != 0
