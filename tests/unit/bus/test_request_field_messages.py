"""The bus fields of vLLM's request fields: DetokParams' return_token_ids, spaces_between_special_tokens,
tool_function and tool_parameter_types, TextDelta.token_ids, SamplingParams' allowed_token_ids, bad_words,
prompt_logprobs and thinking_token_budget, RequestParams' priority, cache_salt, session_id and report_cached; and the
engine's PromptLogprobs and PromptCached messages to the front. Each field is the last of its array-like struct (in the
order added), with a default, so frames of peers that predate it still decode (as "not asked"), and new frames
carry it last."""

from __future__ import annotations

import msgspec
from helpers.bus_rows import text_batch

from detok_worker.bus.codec import encode, engine_decoder, front_decoder, worker_decoder
from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import (
    DetokParams,
    Open,
    PromptLogprobs,
    RequestParams,
    SamplingParams,
    Submit,
    TextBatch,
    TextDelta,
    TokenBatch,
)


def test_a_submit_from_before_the_fields_decodes_with_their_defaults() -> None:
    detok = [["x"], [2], False, True, 0, "", ""]  # DetokParams without return_token_ids
    sampling = [0.5, None, None, None, None, None, None, None, {}, 1, None, None]  # without the two lists
    old_frame = msgspec.msgpack.encode(["submit", "r1", [1, 2], [3, detok, False, sampling], 5, 0])
    message = engine_decoder().decode(old_frame)
    assert isinstance(message, Submit)
    params = message.params
    assert params.detok == DetokParams(stop=["x"], stop_token_ids=[2])
    assert (params.detok.return_token_ids, params.detok.spaces_between_special_tokens) == (False, True)
    assert params.sampling == SamplingParams(temperature=0.5)
    assert (params.sampling.allowed_token_ids, params.sampling.bad_words) == (None, [])
    assert params.sampling.prompt_logprobs is None
    assert (params.priority, params.cache_salt) == (0, None)


def test_new_fields_travel_last() -> None:
    sampling = SamplingParams(
        allowed_token_ids=[5, 9],
        bad_words=["no"],
        prompt_logprobs=-1,
        thinking_token_budget=8,
        extra_args={"k": 1},
        stream_interval=3,
        logprob_token_ids=[4, 2],
    )
    detok = DetokParams(
        return_token_ids=True, spaces_between_special_tokens=False, tool_function="f", tool_parameter_types='{"f":{}}'
    )
    params = RequestParams(
        3,
        detok,
        sampling=sampling,
        priority=-2,
        cache_salt="s1",
        engine_max_tokens=True,
        lora="adapter",
        session_id="c",
        report_cached=True,
    )
    frame = encode(Submit("r1", [1], params))
    raw = msgspec.msgpack.decode(frame)
    # RequestParams: ..., cache_salt, engine_max_tokens, lora, session_id, report_cached
    assert raw[3][-6:] == [-2, "s1", True, "adapter", "c", True]
    # DetokParams: ..., return_token_ids, spaces_between_special_tokens, tool_function, tool_parameter_types
    assert raw[3][1][-4:] == [True, False, "f", '{"f":{}}']
    # SamplingParams: ..., bad_words, prompt_logprobs, thinking_token_budget, extra_args, stream_interval,
    # logprob_token_ids
    assert raw[3][3][-6:] == [["no"], -1, 8, {"k": 1}, 3, [4, 2]]
    assert engine_decoder().decode(frame) == Submit("r1", [1], params)


def test_an_open_asking_for_token_ids_reaches_the_worker() -> None:
    batch = token_batch(1, 0, [Open("r1", [7], DetokParams(return_token_ids=True))], [])
    decoded = worker_decoder().decode(encode(batch))
    assert isinstance(decoded, TokenBatch) and decoded.opens[0].params.return_token_ids is True


def test_a_delta_from_before_token_ids_decodes_without_them() -> None:
    old_extras = ["stop", None, None, None, None]  # up to logprobs
    old_frame = msgspec.msgpack.encode(["text_batch", "w", 0, 1, ["r1"], [0], ["Hi"], [1], {0: old_extras}])
    batch = front_decoder().decode(old_frame)
    assert isinstance(batch, TextBatch) and text_deltas(batch) == [TextDelta("r1", 0, "Hi", 1, finish="stop")]
    assert batch.extras[0].token_ids is None
    new = text_batch("w", 0, 1, [TextDelta("r1", 0, "Hi", 2, token_ids=[9707, 13])])
    raw = msgspec.msgpack.decode(encode(new))
    assert raw[8][0][-2:] == [[9707, 13], None]  # the row's extras end: token_ids, engine_failed
    assert front_decoder().decode(encode(new)) == new
    failed = text_batch("w", 0, 2, [TextDelta("r1", 2, "", 2, finish="error", error="gone", engine_failed=True)])
    assert msgspec.msgpack.decode(encode(failed))[8][0][-1] is True
    assert front_decoder().decode(encode(failed)) == failed


def test_prompt_logprobs_reach_the_front_as_sent() -> None:
    message = PromptLogprobs("r1", [[11, 11, 3]], [[-0.25, -0.25, float("-inf")]], [1])
    frame = encode(message)
    assert msgspec.msgpack.decode(frame)[:2] == ["prompt_logprobs", "r1"]
    assert front_decoder().decode(frame) == message
    assert engine_decoder().decode(frame) is None  # not a message the engine takes
