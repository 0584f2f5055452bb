"""RequestStream's per-request timing (TTFT, mean inter-token latency: two clock reads per request) and the output
budget's cut of a finished stream whose text its handler has not taken."""

from __future__ import annotations

import types

import pytest

from detok_worker.bus.messages import DetokParams, TextDelta
from detok_worker.front import request_stream
from detok_worker.front.errors import APIError
from detok_worker.front.request_stream import RequestStream
from detok_worker.stream.stop.rules import StopLimits, StopRules


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(request_stream, "time", types.SimpleNamespace(monotonic=fake.monotonic))
    return fake


def make_stream() -> RequestStream:
    rules = StopRules.from_params(DetokParams(), StopLimits(), eos_ids=[2])
    return RequestStream("r", prompt_tokens=3, deadline=1e18, stop_rules=rules)


def test_ttft_is_the_first_delta_with_tokens_and_itl_the_mean_after_it(clock: Clock) -> None:
    stream = make_stream()
    clock.now = 100.5
    stream.accept(TextDelta("r", 0, "", 0))  # no output token yet: not the first token
    clock.now = 101.0
    stream.accept(TextDelta("r", 0, "He", 2))
    clock.now = 101.3
    stream.accept(TextDelta("r", 2, "llo", 5))
    assert stream.mean_itl_s() is None  # not finished yet
    clock.now = 102.0
    stream.accept(TextDelta("r", 5, "!", 12, finish="length"))
    assert stream.ttft_s(started=100.0) == pytest.approx(1.0)
    assert stream.mean_itl_s() == pytest.approx(1.0 / 10)  # 10 tokens after the first delta's 2, in 1 s


def test_no_timing_without_output_or_after_a_failure(clock: Clock) -> None:
    silent = make_stream()
    silent.accept(TextDelta("r", 0, "", 0, finish="stop"))
    assert (silent.ttft_s(started=100.0), silent.mean_itl_s()) == (None, None)
    failed = make_stream()
    failed.accept(TextDelta("r", 0, "a", 1))
    failed.accept(TextDelta("r", 1, "", 4, finish="error", error="bad id"))
    assert failed.ttft_s(started=99.0) == pytest.approx(1.0)
    assert failed.mean_itl_s() is None
    one_delta = make_stream()
    one_delta.accept(TextDelta("r", 0, "all at once", 3, finish="stop"))
    assert one_delta.mean_itl_s() is None  # no token after the first delta


def test_a_finished_stream_keeps_its_end_unless_its_unread_text_is_dropped() -> None:
    stream = make_stream()
    stream.accept(TextDelta("r", 0, "unread text", 3, finish="stop"))
    stream.fail(APIError(502, "late"), drop_text=False)
    assert (stream.finish, stream.failure, stream.pending_chars) == ("stop", None, 11)
    cut = APIError(503, "too slow", code="client_too_slow")
    stream.fail(cut, drop_text=True)
    assert (stream.failure, stream.pending_chars, stream._pieces) == (cut, 0, [])
