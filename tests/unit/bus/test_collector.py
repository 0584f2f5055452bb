"""The front-side collector: exactly-once assembly by offset, endings, and its socket side."""

from __future__ import annotations

import time

from helpers.bus_peers import bus_config, raw_push, short_runtime_dir
from helpers.bus_rows import text_batch

from detok_worker.bus.codec import encode
from detok_worker.bus.collector import CollectedRequest, FrontCollector
from detok_worker.bus.messages import EngineStats, Reject, TextDelta, WorkerStats
from detok_worker.bus.reassembly import GAP_ERROR, DeltaReassembly


def test_deltas_assemble_in_order_and_reopened_text_is_trimmed():
    request = CollectedRequest("r")
    assert request.apply(TextDelta("r", 0, "Hello", 1), 10) == "Hello"
    assert request.apply(TextDelta("r", 5, ", wor", 3), 20) == ", wor"
    # a re-open replays from offset 0 on another worker: only the new tail is delivered
    assert request.apply(TextDelta("r", 0, "Hello, world", 4), 30) == "ld"
    assert request.apply(TextDelta("r", 12, "!", 5, finish="stop", stop_reason="###"), 40) == "!"
    assert request.text == "Hello, world!"
    assert (request.chars, request.n_tokens, request.duplicate_chars, request.gaps) == (13, 5, 10, 0)
    assert (request.finish, request.stop_reason, request.done) == ("stop", "###", True)
    assert (request.first_ns, request.last_ns) == (10, 40)
    # nothing after the end
    assert request.apply(TextDelta("r", 13, "late", 6), 50) == ""
    assert request.text == "Hello, world!"


def test_gap_ends_the_request_with_an_error_and_delivers_nothing_out_of_place():
    request = CollectedRequest("r")
    assert request.apply(TextDelta("r", 0, "ab", 1)) == "ab"
    assert request.apply(TextDelta("r", 5, "xy", 2)) == ""  # characters 2..4 never arrived
    assert request.gaps == 1
    assert (request.finish, request.error) == ("error", GAP_ERROR)
    assert request.text == "ab"
    assert request.apply(TextDelta("r", 2, "cdexy", 3)) == ""  # ended: nothing more, even text that fits


def test_reassembly_rule():
    reassembly = DeltaReassembly()
    assert reassembly.take(TextDelta("r", 0, "abc", 1)) == "abc"
    assert reassembly.take(TextDelta("r", 1, "bcd", 2)) == "d"  # overlap: only the new tail
    assert reassembly.take(TextDelta("r", 0, "ab", 2)) == ""  # all seen
    assert (reassembly.delivered, reassembly.duplicate_chars, reassembly.gap) == (4, 4, False)
    assert reassembly.take(TextDelta("r", 6, "g", 3)) is None
    assert reassembly.gap


def test_reject_ends_with_an_error_once():
    request = CollectedRequest("r")
    request.reject("no detok worker is alive")
    assert (request.finish, request.error, request.rejected) == ("error", "no detok worker is alive", True)
    finished = CollectedRequest("s")
    finished.apply(TextDelta("s", 0, "x", 1, finish="length"))
    finished.reject("late")
    assert (finished.finish, finished.rejected) == ("length", False)


def test_collector_over_sockets_counts_bad_frames():
    with short_runtime_dir() as runtime:
        config = bus_config(runtime)
        with FrontCollector(config) as front:
            sockets, push = raw_push(config, "front")
            try:
                push.send(encode(text_batch("w", time.time_ns(), 1, [TextDelta("a", 0, "héllo", 2, finish="length")])))
                push.send(encode(Reject("b", "nope")))
                push.send(encode(WorkerStats("w", 1, 0, {}, 2, 5)))
                push.send(encode(EngineStats(0, {"w": 0}, {}, 0, 0)))
                push.send(b"\xc1 not msgpack")
                push.send(encode(["delta", "a", 0]))
                push.send_multipart([b"x", b"y"])
                assert front.wait_done(["a", "b"], 10)
                assert front.wait_for(lambda: sum(front.decoder.bad_frames.values()) == 3, 10)
            finally:
                sockets.close()
            assert front.decoder.bad_frames["multipart"] == 1
            assert front.requests["a"].text == "héllo"
            assert front.requests["b"].rejected
            assert front.worker_stats["w"].chars_out == 5
            assert front.engine_stats == EngineStats(0, {"w": 0}, {}, 0, 0)
            assert len(front.latencies_ns) == 1 and front.text_batches == 1
