"""What a worker's Open derives from the request's DetokParams alone, kept per distinct params (a bounded LRU).

Requests of a deployment mostly carry the same stop settings (the EOS ids, a stop string or two), so an Open that
finds its params here skips the stop rules' validation (StopRules.from_params, against the worker's fixed limits)
and the decoder's stop settings checked against the tokenizer (PreparedStops): both are functions of the params
alone, and a plan is kept only once both passed. Everything that depends on more than the params is still done
per Open by WorkerState._open: the live stop-chars budget, the parsers and the prompt tail, and each request's own
decoder (its stream, its stop-string state, its counters). The stop-string automaton is not kept here: its own
cache (matcher.compile_stop_strings) bounds how many of them, with their memos, a worker holds.

The key is the params' msgpack encoding: exact as to types (True, 1.0 and 1 are three keys, so a cached plan for
stop token 1 never stands for the bool or the float that the rules refuse), and any field added to DetokParams is
in it. Params that cannot be encoded are planned per Open, uncached.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass

import msgspec

from detok_worker.bus.messages import DetokParams
from detok_worker.stream.stop.rules import StopRules
from detok_worker.stream.stop.settings import PreparedStops
from detok_worker.tokenizer.protocol import Tokenizer

OPEN_PLANS_CAPACITY = 256
_encode = msgspec.msgpack.Encoder().encode


@dataclass(frozen=True, slots=True)
class OpenPlan:
    rules: StopRules  # validated against the worker's limits
    # the decoder's stop settings; with a parser, without the stop strings (worker/parsing.py). Whether a request
    # has a parser is a function of its params too: parsing_for gives one exactly when the params name one.
    stops: PreparedStops


def prepare_stops(tokenizer: Tokenizer, rules: StopRules, parsed: bool) -> PreparedStops:
    """The decoder's stop settings for a request with these rules; with a parser (`parsed`) stop strings apply to
    the parsed content instead (worker/parsing.py), so the decoder gets none. Raises ParameterError."""
    config = rules.decoder_config()
    if parsed:
        config = dataclasses.replace(config, stop_sequences=(), visible_stop_sequences=())
    return PreparedStops.check(tokenizer, config)


class OpenPlans:
    """Plans by params key, at most `capacity` of them, the least recently used dropped first."""

    def __init__(self, capacity: int = OPEN_PLANS_CAPACITY) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[bytes, OpenPlan] = OrderedDict()

    def __len__(self) -> int:
        return len(self._plans)

    @staticmethod
    def key_of(params: DetokParams) -> bytes | None:
        """The params' key, or None for params that cannot be encoded (never cached)."""
        try:
            return _encode(params)
        except (TypeError, OverflowError):
            return None

    def get(self, key: bytes | None) -> OpenPlan | None:
        if key is None:
            return None
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        return plan

    def add(self, key: bytes | None, plan: OpenPlan) -> None:
        """Keep a plan whose every check passed."""
        if key is None:
            return
        self._plans[key] = plan
        if len(self._plans) > self.capacity:
            self._plans.popitem(last=False)
