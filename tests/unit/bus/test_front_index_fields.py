"""The fields added after the first release (front index for several front processes, a worker's columns
capability, the engine's vocabulary size on an Open): trailing and optional, so frames of senders that predate them
still decode (as front 0, as a worker without columns, as an unknown vocabulary size), and FrontHello reaches the
engine's decoder."""

from __future__ import annotations

import msgspec

from detok_worker.bus.codec import encode, engine_decoder, worker_decoder
from detok_worker.bus.columns import token_batch
from detok_worker.bus.messages import DetokParams, FrontHello, Open, RequestParams, Submit, TokenBatch


def test_a_submit_without_the_front_field_decodes_as_front_0():
    params = msgspec.to_builtins(RequestParams(max_tokens=3))
    old_frame = msgspec.msgpack.encode(["submit", "r1", [1, 2], params, 5])
    message = engine_decoder().decode(old_frame)
    assert message == Submit("r1", [1, 2], RequestParams(max_tokens=3), 5, 0)
    assert engine_decoder().decode(encode(Submit("r2", [3], RequestParams(max_tokens=1), 0, 2))).front == 2


def test_an_open_without_the_front_field_decodes_as_front_0():
    detok = msgspec.to_builtins(DetokParams())
    old_frame = msgspec.msgpack.encode(["token_batch", 1, 0, [["open", "r1", [7], detok]], []])
    batch = worker_decoder().decode(old_frame)
    assert isinstance(batch, TokenBatch) and batch.opens == [Open("r1", [7], DetokParams(), 0)]


def test_an_open_without_the_vocab_size_field_decodes_as_size_0():
    detok = msgspec.to_builtins(DetokParams())
    old_frame = msgspec.msgpack.encode(["token_batch", 1, 0, [["open", "r1", [7], detok, 2]], []])
    batch = worker_decoder().decode(old_frame)
    assert isinstance(batch, TokenBatch) and batch.opens == [Open("r1", [7], DetokParams(), 2, 0)]
    new_frame = encode(token_batch(2, 0, [Open("r2", [], DetokParams(), vocab_size=151_936)], []))
    assert msgspec.msgpack.decode(new_frame)[3][0][-1] == 151_936  # the last element of the Open
    assert worker_decoder().decode(new_frame).opens[0].vocab_size == 151_936


def test_front_hello_decodes_at_the_engine():
    decoder = engine_decoder()
    assert decoder.decode(encode(FrontHello(1, 4242))) == FrontHello(1, 4242)
    assert not decoder.bad_frames
