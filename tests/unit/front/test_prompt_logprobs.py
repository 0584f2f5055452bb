"""vLLM's prompt_logprobs through detok's front: the rendering of the engine's PromptLogprobs (vLLM's shape, its
decoded tokens and its corrections of partial characters), and the front with a played engine (real app, real
sockets): where the entries go for completions (every choice) and chat (the response), n > 1 asking the engine
once, a stream with 0, an engine that sends none or sends rows that do not fit the prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers.front_harness import FrontUnderTest, played_prompt_logprobs, running_front

from detok_worker.bus.messages import LogprobText, PromptLogprobs, RequestParams, SamplingParams, Submit, TextDelta
from detok_worker.front import prompt_logprobs
from detok_worker.front.openai_api import PromptLogprobOut
from detok_worker.front.prompt_logprobs import PromptLogprobsError, render_prompt_logprobs

CJK = [64, 18137, 122, 246, 293]  # "a 龘 b": the character's three bytes are three tokens, each decoding to U+FFFD


@pytest.fixture(scope="module")
def vllm_front(qwen3: Any) -> Iterator[FrontUnderTest]:
    with running_front(qwen3, **{"engine.source": "vllm", "engine.model": "qwen3-tiny"}) as under_test:
        yield under_test


def rows(prompt: list[int], top: list[int]) -> PromptLogprobs:
    """Row i: prompt token i + 1 (logprob -(i + 1), rank i + 5), then `top` (logprobs -0.5, -1.5, ...)."""
    n = len(prompt) - 1
    return PromptLogprobs(
        "r",
        [[token_id, *top] for token_id in prompt[1:]],
        [[-(i + 1.0), *(-0.5 - j for j in range(len(top)))] for i in range(n)],
        [i + 5 for i in range(n)],
    )


def test_entries_are_vllms_shape_with_partial_characters_decoded_as_vllm_does(qwen3: Any) -> None:
    """The first prompt token has None; a token that holds part of a character decodes, after the prompt tokens
    before it, to "" until the token that completes the character, which gives all of it (vLLM's correction: the
    first prompt token is never context)."""
    out = render_prompt_logprobs(rows(CJK, [15, 16]), CJK, 2, qwen3)
    assert out[0] is None and len(out) == len(CJK)
    texts = [entry[token_id].decoded_token for entry, token_id in zip(out[1:], CJK[1:], strict=True)]  # type: ignore[index]
    assert texts == ["", "", " 龘", " b"]
    assert out[4] == {
        293: PromptLogprobOut(-4.0, 8, " b"),
        15: PromptLogprobOut(-0.5, 1, qwen3.decode([15])),
        16: PromptLogprobOut(-1.5, 2, qwen3.decode([16])),
    }
    assert list(out[4]) == [293, 15, 16]  # type: ignore[arg-type]  # the prompt token first, then the top ones


def test_k_limits_the_candidates_and_a_prompt_token_among_them_keeps_its_place_with_their_values(qwen3: Any) -> None:
    prompt = [9707, 11, 1879]
    message = PromptLogprobs(
        "r", [[11, 11, 5], [1879, 7, 8]], [[-0.1, -0.1, -2.0], [float("-inf"), -1.0, -2.0]], [1, 9]
    )
    out = render_prompt_logprobs(message, prompt, 1, qwen3)
    assert out[1] == {11: PromptLogprobOut(-0.1, 1, qwen3.decode([11]))}
    assert out[2] == {1879: PromptLogprobOut(-9999.0, 9, qwen3.decode([1879])), 7: PromptLogprobOut(-1.0, 1, "(")}
    everything = render_prompt_logprobs(message, prompt, -1, qwen3)
    assert [len(entry) for entry in everything[1:]] == [2, 3]  # type: ignore[arg-type]
    assert render_prompt_logprobs(PromptLogprobs("r", [], [], []), [42], 0, qwen3) == [None]


@pytest.mark.parametrize(
    "message",
    [
        PromptLogprobs("r", [[11]], [[-1.0]], [1]),  # one row for a prompt of three tokens
        PromptLogprobs("r", [[11], [1879]], [[-1.0], [-1.0, -2.0]], [1, 1]),  # ids and logprobs differ in number
        PromptLogprobs("r", [[11], []], [[-1.0], []], [1, 1]),  # an empty row
        PromptLogprobs("r", [[11], [1879]], [[-1.0], [-1.0]], [1]),  # ranks missing
    ],
)
def test_rows_that_do_not_fit_the_prompt_are_an_error(qwen3: Any, message: PromptLogprobs) -> None:
    with pytest.raises(PromptLogprobsError):
        render_prompt_logprobs(message, [9707, 11, 1879], 0, qwen3)


def post(front: FrontUnderTest, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Submit]]:
    while not front.engine.submits.empty():
        front.engine.submits.get_nowait()
    response = httpx.post(f"{front.url}{path}", json=body, timeout=30)
    submits = []
    while not front.engine.submits.empty():
        submits.append(front.engine.submits.get_nowait())
    return response, submits


def expected(front: FrontUnderTest, submit: Submit) -> list[Any]:
    """What the played engine's rows look like to a client (JSON: token ids as strings)."""
    message = played_prompt_logprobs(submit)
    tokenizer = front.tokenizer
    out: list[Any] = [None]
    for ids, values, rank in zip(message.token_ids, message.logprobs, message.ranks, strict=True):
        ranks = [rank, *range(1, len(ids))]
        out.append(
            {
                str(token_id): {"logprob": value, "rank": token_rank, "decoded_token": tokenizer.decode([token_id])}
                for token_id, value, token_rank in zip(ids, values, ranks, strict=True)
            }
        )
    return out


def test_completions_give_every_choice_the_prompts_entries_and_ask_the_engine_once(vllm_front: FrontUnderTest) -> None:
    body = {"prompt": "Hello there, friend", "max_tokens": 3, "n": 2, "prompt_logprobs": 2}
    response, submits = post(vllm_front, "/v1/completions", body)
    assert response.status_code == 200, response.text
    first = min(submits, key=lambda submit: submit.rid)
    assert sorted(submit.params.sampling.prompt_logprobs for submit in submits if submit is not first) == [None]
    assert first.params.sampling.prompt_logprobs == 2
    choices = response.json()["choices"]
    assert len(first.prompt_ids) == 4
    assert choices[0]["prompt_logprobs"] == choices[1]["prompt_logprobs"] == expected(vllm_front, first)


def test_chat_puts_the_entries_on_the_response(vllm_front: FrontUnderTest) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "prompt_logprobs": -1}
    response, (submit,) = post(vllm_front, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert "prompt_logprobs" not in answer["choices"][0]
    assert answer["prompt_logprobs"] == expected(vllm_front, submit)
    assert len(answer["prompt_logprobs"]) == len(submit.prompt_ids) and len(answer["prompt_logprobs"][1]) == 4


def test_a_stream_with_zero_is_accepted_without_asking_the_engine(vllm_front: FrontUnderTest) -> None:
    """vLLM's server accepts 0 on a stream and shows nothing (its chunks have no such field)."""
    body = {"prompt": "Hello there", "max_tokens": 3, "stream": True, "prompt_logprobs": 0}
    response, (submit,) = post(vllm_front, "/v1/completions", body)
    assert response.status_code == 200 and "prompt_logprobs" not in response.text, response.text
    assert submit.params.sampling == SamplingParams()


def test_requests_without_the_field_show_none(vllm_front: FrontUnderTest) -> None:
    response, (submit,) = post(vllm_front, "/v1/completions", {"prompt": "Hello there", "max_tokens": 3})
    assert response.status_code == 200 and "prompt_logprobs" not in response.text
    assert submit.params == RequestParams(max_tokens=3)


def test_an_engine_that_sends_none_or_bad_rows_fails_the_request(
    vllm_front: FrontUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prompt_logprobs, "ARRIVAL_WAIT_S", 0.3)
    body = {"prompt": "Hello there", "max_tokens": 3, "prompt_logprobs": 1}
    try:
        vllm_front.engine.prompt_plan = lambda submit: None
        response, _ = post(vllm_front, "/v1/completions", body)
        assert response.status_code == 502 and "no prompt logprobs" in response.json()["error"]["message"]
        vllm_front.engine.prompt_plan = lambda submit: PromptLogprobs(submit.rid, [], [], [])
        response, _ = post(vllm_front, "/v1/completions", body)
        assert response.status_code == 502 and "unusable" in response.json()["error"]["message"], response.text
    finally:
        vllm_front.engine.prompt_plan = played_prompt_logprobs


def test_an_echoed_completion_with_logprobs_starts_them_with_the_prompts(vllm_front: FrontUnderTest) -> None:
    """As vLLM's server: echo with logprobs asks the engine for the prompt's logprobs (k = logprobs) and the
    choice's logprobs start with the prompt's tokens, the first with its decode alone and nulls, then each with its
    decoded_token, logprob and the first k + 1 entries of its position; text_offset runs from the prompt's start."""
    body = {"prompt": "Hello there, friend", "max_tokens": 3, "echo": True, "logprobs": 1}
    response, (submit,) = post(vllm_front, "/v1/completions", body)
    assert response.status_code == 200, response.text
    assert submit.params.sampling.prompt_logprobs == 1
    choice = response.json()["choices"][0]
    shown, prompt, logprobs = expected(vllm_front, submit), submit.prompt_ids, choice["logprobs"]
    assert choice["prompt_logprobs"] == shown
    n = len(prompt)
    own = [shown[i][str(prompt[i])] for i in range(1, n)]
    assert logprobs["tokens"][:n] == [vllm_front.tokenizer.decode(prompt[:1])] + [e["decoded_token"] for e in own]
    assert "".join(logprobs["tokens"][:n]) == "Hello there, friend"
    assert logprobs["token_logprobs"][:n] == [None] + [e["logprob"] for e in own]
    assert logprobs["top_logprobs"][0] is None
    for i in range(1, n):  # the prompt token, then the engine's best candidate (k + 1 = 2 entries)
        entries = list(shown[i].values())[:2]
        assert logprobs["top_logprobs"][i] == {e["decoded_token"]: e["logprob"] for e in entries}
    tokens = logprobs["tokens"]
    assert logprobs["text_offset"] == [sum(len(token) for token in tokens[:i]) for i in range(len(tokens))]
    assert choice["text"].startswith("Hello there, friend")


def test_a_streamed_echo_with_logprobs_carries_the_prompts_on_its_first_chunk(vllm_front: FrontUnderTest) -> None:
    """As vLLM's server streams it: the engine scores the prompt (k = logprobs) and the echo's chunk carries the
    prompt's part of the logprobs; the chunks' logprobs joined are the whole answer's, text offsets included."""

    def with_logprobs(submit: Submit) -> list[TextDelta]:  # the output is the prompt's ids, each with an entry
        plan = vllm_front.echo_plan(submit)
        for delta, token_id in zip(plan, submit.prompt_ids, strict=True):
            token = vllm_front.tokenizer.decode([token_id])
            delta.logprobs = [LogprobText(token, token.encode(), -0.25, [LogprobText("x", b"x", -2.0)], token_id)]
        return plan

    body = {"prompt": "Hello there, friend", "max_tokens": 4, "echo": True, "logprobs": 1}
    vllm_front.set_plan(with_logprobs)
    try:
        whole, _ = post(vllm_front, "/v1/completions", body)
        response, (submit,) = post(vllm_front, "/v1/completions", {**body, "stream": True})
    finally:
        vllm_front.set_plan(vllm_front.echo_plan)
    assert response.status_code == 200 and submit.params.sampling.prompt_logprobs == 1, response.text
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    first = chunks[0]["choices"][0]
    assert first["text"] == "Hello there, friend" and len(first["logprobs"]["tokens"]) == len(submit.prompt_ids)
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        for choice in chunk["choices"]:
            for key, values in joined.items():
                values += (choice.get("logprobs") or {}).get(key, [])
    assert joined == whole.json()["choices"][0]["logprobs"]
    assert joined["tokens"] == ["Hello", " there", ",", " friend"] * 2  # the prompt's, then the output's
    assert joined["text_offset"] == [0, 5, 11, 12, 19, 24, 30, 31]  # the output's run on from the prompt's


def test_echo_with_logprobs_asks_no_prompt_logprobs_of_another_source(qwen3: Any) -> None:
    body = {"prompt": "Hello there", "max_tokens": 3, "echo": True, "logprobs": 1}
    with running_front(qwen3) as local:  # a local source scores no prompt
        response, (submit,) = post(local, "/v1/completions", body)
    assert response.status_code == 200 and submit.params.sampling.prompt_logprobs is None, response.text
    assert "prompt_logprobs" not in response.json()["choices"][0]
