"""StopRules: the one stop rule (limits, the EOS rule, hidden/visible, the client's stop_reason)."""

from __future__ import annotations

import pytest

from detok_worker.bus.messages import DetokParams
from detok_worker.errors import ParameterError
from detok_worker.stream.stop.rules import StopLimits, StopRules

LIMITS = StopLimits(max_strings=2, max_string_chars=5)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (DetokParams(stop=["a", "b", "c"]), "stop"),
        (DetokParams(stop=["abcdef"]), "stop"),
        (DetokParams(stop=[""]), "stop"),
        (DetokParams(stop_token_ids=[-1]), "stop_token_ids"),
        (DetokParams(min_tokens=-1), "min_tokens"),
    ],
)
def test_each_broken_limit_names_its_field(params: DetokParams, param: str) -> None:
    with pytest.raises(ParameterError) as caught:
        StopRules.from_params(params, LIMITS)
    assert caught.value.param == param


def test_limits_at_the_maximum_are_accepted() -> None:
    rules = StopRules.from_params(DetokParams(stop=["abcde", "x"], stop_token_ids=[7, 8]), LIMITS)
    assert rules.params.stop == ["abcde", "x"]


def test_stop_token_ids_are_not_counted_against_the_stop_strings_limit() -> None:
    """max_stop_strings bounds stop strings only, as vLLM's VLLM_MAX_STOP_STRINGS: more stop token ids than it are
    accepted, and so are the worker's params, which carry the EOS ids the engine added to the client's."""
    rules = StopRules.from_params(DetokParams(stop_token_ids=[1, 2, 3]), LIMITS, eos_ids=[4, 5])
    assert StopRules.from_params(rules.worker_params(), LIMITS).params.stop_token_ids == [1, 2, 3, 4, 5]


def test_eos_rule_adds_eos_ids_unless_ignore_eos() -> None:
    params = DetokParams(stop=["x"], stop_token_ids=[9, 5])
    rules = StopRules.from_params(params, LIMITS, eos_ids=[5, 2])
    assert rules.worker_params().stop_token_ids == [9, 5, 2]  # the client's first, EOS after, no duplicate
    assert rules.worker_params().stop == ["x"]
    ignored = StopRules.from_params(params, LIMITS, eos_ids=[5, 2], ignore_eos=True)
    assert ignored.worker_params().stop_token_ids == [9, 5]


def test_hidden_and_visible_decoder_config() -> None:
    hidden = StopRules.from_params(DetokParams(stop=["x"], stop_token_ids=[4]), LIMITS, eos_ids=[2]).decoder_config()
    assert (hidden.stop_sequences, hidden.stop_tokens, hidden.visible_stop_sequences) == (("x",), (4, 2), ())
    visible_params = DetokParams(stop=["x"], stop_token_ids=[4], include_stop_str_in_output=True)
    visible = StopRules.from_params(visible_params, LIMITS, eos_ids=[2]).decoder_config()
    assert (visible.visible_stop_sequences, visible.visible_stop_tokens, visible.stop_tokens) == (("x",), (4, 2), ())


def test_client_stop_reason_is_null_for_eos_only() -> None:
    rules = StopRules.from_params(DetokParams(stop=["x"], stop_token_ids=[4]), LIMITS, eos_ids=[2])
    assert rules.client_stop_reason(2) is None
    assert rules.client_stop_reason(4) == 4
    assert rules.client_stop_reason("x") == "x"
    assert rules.client_stop_reason(None) is None
