"""Bad input found by the bus fuzz tests, pinned down where it is handled:

- a frame holding a string that is not UTF-8 (msgspec raises UnicodeDecodeError, not a DecodeError, for it: one
  such frame used to kill the engine or a worker) is counted as undecodable, absurdly deep nesting as schema;
- a Tokens item whose finish is not a known reason ends only that rid, with an error (it used to reach the client
  as finish_reason "bogus")."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from helpers.fixtures import load_fixture_tokenizer

from detok_worker.bus.codec import BAD_SCHEMA, BAD_UNDECODABLE, engine_decoder, front_decoder, worker_decoder
from detok_worker.bus.columns import text_deltas, token_batch
from detok_worker.bus.messages import Abort, DetokParams, Finish, Open, Reject, Shutdown, TextDelta, Tokens
from detok_worker.worker.endings import BAD_RID_ERROR
from detok_worker.worker.state import WorkerState


@pytest.mark.parametrize(
    ("make_decoder", "message"),
    [(engine_decoder, Abort("RID")), (worker_decoder, Shutdown("RID")), (front_decoder, Reject("RID", "e"))],
)
def test_non_utf8_strings_and_deep_nesting_are_counted_not_raised(make_decoder: Any, message: object) -> None:
    decoder = make_decoder()
    frame = msgspec.msgpack.encode(message)
    not_utf8 = frame.replace(b"RID", b"\xff\xfe\x80")
    surrogate = frame.replace(b"RID", b"\xed\xa0\x80")  # a lone surrogate, UTF-8-encoded
    nested = b"\x91" * 100_000 + b"\x90"
    for bad in (not_utf8, surrogate, nested):
        assert decoder.decode(bad) is None
    assert decoder.bad_frames[BAD_UNDECODABLE] == 2
    assert decoder.bad_frames[BAD_SCHEMA] == 1  # typed decoding stops at the first wrong type: no deep recursion
    assert decoder.decode(frame) == message


def test_unknown_finish_reason_ends_only_that_rid_with_an_error() -> None:
    tokenizer = load_fixture_tokenizer("qwen3")
    state = WorkerState(tokenizer, "w")
    ids = tokenizer.encode("Hello world").ids
    opens = [Open("a", [], DetokParams()), Open("b", [], DetokParams())]
    state.handle_batch(token_batch(1, 0, opens, [("a", Tokens(ids)), ("b", Tokens(ids))]))
    result = state.handle_batch(token_batch(2, 0, [], [("a", Tokens([], "bogus")), ("b", Tokens([], "length"))]))
    by_rid = {delta.rid: delta for delta in text_deltas(result.text_batch)}
    assert by_rid["a"].finish == "error" and "bogus" in (by_rid["a"].error or "")
    assert by_rid["b"] == TextDelta("b", len("Hello world"), "", len(ids), finish="length")
    assert result.finishes == [Finish("a", "error", None, len(ids))]
    assert state.live_rids == 0 and state.bad[BAD_RID_ERROR] == 1
