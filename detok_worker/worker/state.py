"""The pure part of a detok worker: the rid table and TokenBatch -> TextBatch (+ Finish messages to the engine).

No sockets, no clocks except what the caller passes in, so every rule is unit-testable:
- Open starts a rid (or, for a live rid, re-opens it: the state is replaced and the text starts again at offset 0;
  the front drops what it already delivered).
- Tokens for a live rid go through its StopSequenceDecoder; a delta is produced only when there is news (text or
  a finish). On a stop (string, stop token, EOS as a hidden stop token) the rid ends with finish "stop" and the
  engine gets a Finish; a bad token id ends only that rid with finish "error". A Tokens item with finish set
  (EOS/max_tokens/abort decided by the engine) flushes and ends the rid with that finish.
- Tokens for a rid that ended recently are dropped silently; for a rid never opened they are counted as bad.
- Tokens with logprobs (only for requests that asked) take a slower path beside the hot loop: the item is handled
  as if it had none, then the entries of the ids it consumed ride on the delta it produced, or wait for the rid's
  next delta while its text is held back (an unfinished character, a possible stop string). So each delta carries
  the entries of the tokens consumed since the previous one, and their count is the rid's n_tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from detok_worker.bus.columns import MISMATCHED_COLUMNS, columns_ok, text_deltas
from detok_worker.bus.messages import (
    Finish,
    Open,
    TextBatch,
    TextDelta,
    TokenBatch,
    Tokens,
)
from detok_worker.stream import StopSequenceDecoder
from detok_worker.stream.stop.rules import DEFAULT_STOP_LIMITS, StopLimits, StopRuleError, StopRules
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.worker.ended import RecentlyEnded
from detok_worker.worker.endings import RidEndings
from detok_worker.worker.lane import TICK_EVERY_ITEMS, RidState, step_lanes
from detok_worker.worker.logprobs import TokenTexts
from detok_worker.worker.parsing import parsing_for

log = logging.getLogger(__name__)

BAD_PARAMS = "bad_params"  # Open whose DetokParams break the configured limits
BAD_STOP_BUDGET = "stop_budget"  # Open refused: the live rids' stop strings would pass worker.max_live_stop_chars
DEFAULT_MAX_LIVE_STOP_CHARS = 4_194_304
RECENTLY_ENDED_CAPACITY = 16_384


@dataclass(slots=True)
class BatchResult:
    """What one TokenBatch produces: exactly one TextBatch for the front, and Finish messages for the engine."""

    text_batch: TextBatch
    finishes: list[Finish] = field(default_factory=list)


class WorkerState(RidEndings):
    """Per-rid stream and stop state of one worker."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        worker_id: str,
        stop_limits: StopLimits = DEFAULT_STOP_LIMITS,
        max_live_stop_chars: int = DEFAULT_MAX_LIVE_STOP_CHARS,
    ) -> None:
        self.tokenizer = tokenizer
        self.token_texts = TokenTexts(tokenizer)
        self.worker_id = worker_id
        self.stop_limits = stop_limits
        # Stop-matching memory of a rid grows with the text it scans, up to linear in its stop strings' length:
        # their total over live rids is bounded, and an Open past the bound ends that rid with an error.
        self.max_live_stop_chars = max_live_stop_chars
        self.live_stop_chars = 0
        self.live: dict[str, RidState] = {}
        self._ended = RecentlyEnded(RECENTLY_ENDED_CAPACITY)
        self.bad: Counter[str] = Counter()
        self.tokens_in = 0
        self.chars_out = 0
        # cumulative, for metrics (read at the stats interval, never per token)
        self.tokens_consumed = 0
        self.holds = 0  # rid steps that consumed ids but released no text yet (incomplete char / stop prefix)
        self.stops: Counter[str] = Counter()  # rids ended by a stop rule found here: "string" or "token"

    @property
    def live_rids(self) -> int:
        return len(self.live)

    def handle_batch(self, batch: TokenBatch, tick: Callable[[], None] | None = None) -> BatchResult:
        """One TokenBatch in, one TextBatch out. sent_ns/step are copied from the TokenBatch so the front can
        measure engine-to-front latency. `tick` (the worker's timers: heartbeats) is called after each Open and
        every TICK_EVERY_ITEMS items, so a long batch cannot starve the worker's heartbeats.

        The batch's columns (the usual item: one id) are the hot path, worker/lane.py: a rid on its lane
        (StopSequenceDecoder.lane) is stepped by a table lookup, no call, and its text goes to the TextBatch's
        columns; every other column entry, and then every item, goes through _items in order (bus/columns.py:
        the order rule)."""
        deltas: list[TextDelta] = []
        finishes: list[Finish] = []
        for open_ in batch.opens:
            self._open(open_, deltas, finishes)
            if tick is not None:
                tick()
        text_batch = TextBatch(self.worker_id, batch.sent_ns, batch.step, deltas)
        if not columns_ok(batch):  # the frame decoder drops such frames: this is a caller's bug
            raise ValueError(MISMATCHED_COLUMNS)
        slow: list[Tokens] = []
        if batch.rids:
            slow, stepped, chars_out, holds = step_lanes(self.live, batch.rids, batch.ids, text_batch, tick)
            self.tokens_in += stepped
            self.tokens_consumed += stepped
            self.chars_out += chars_out
            self.holds += holds
        self._items(slow + batch.items if slow else batch.items, text_batch, finishes, tick)
        return BatchResult(text_batch, finishes)

    def _items(
        self, items: list[Tokens], out: TextBatch, finishes: list[Finish], tick: Callable[[], None] | None
    ) -> None:
        """Items one by one through the rid's decoder. An item that only adds text is handled inline (one id, no
        parser: process_one's text goes straight into `out`'s columns, unless the rid already has a delta in
        `out.items`: then after it, bus/columns.py's order rule); endings and unknown rids go through _end_item.
        A rid that released text gets its lane back for the next batch's columns."""
        deltas = out.items
        live_get = self.live.get
        out_rids, out_offsets, out_texts, out_n_tokens = out.rids, out.offsets, out.texts, out.n_tokens
        itemized: set[str] = set()  # rids with a delta in out.items: their plain deltas follow there
        tokens_in = chars_out = holds = single = 0
        for start in range(0, len(items), TICK_EVERY_ITEMS):
            if tick is not None and start:
                tick()
            for item in items[start : start + TICK_EVERY_ITEMS]:
                rid = item.rid
                state = live_get(rid)
                if state is not None and state.lane is not None:
                    state.decoder.sync_generated(state.n_tokens)
                    state.lane = None
                ids = item.ids
                before = len(deltas)
                if state is None or item.finish is not None or item.logprobs is not None:
                    if state is not None and (item.logprobs is not None or state.logprobs):
                        self._logprobs_item(item, state, deltas, finishes)  # held entries go with the last delta
                    else:
                        self._end_item(item, state, deltas, finishes)
                else:
                    try:
                        if len(ids) == 1 and state.parsing is None:
                            result = state.decoder.process_one(ids[0])
                        else:
                            result = state.decoder.process_tokens(ids)
                    except Exception as exc:  # noqa: BLE001 - a decoder failure ends only this rid
                        tokens_in += len(ids)
                        self._end_with_error(rid, state, "", f"detokenization failed: {exc}", deltas, finishes)
                        itemized.add(rid)
                        continue
                    if type(result) is str:  # the fused branch: one id, no parser, text only
                        single += 1
                        n_tokens = state.n_tokens = state.n_tokens + 1
                        if not result:
                            holds += 1  # bytes of a character or a possible stop string held: no lane yet
                            continue
                        if rid in itemized:
                            deltas.append(TextDelta(rid, state.offset, result, n_tokens))
                        else:
                            out_rids.append(rid)
                            out_offsets.append(state.offset)
                            out_texts.append(result)
                            out_n_tokens.append(n_tokens)
                        state.offset += len(result)
                        chars_out += len(result)
                        state.lane = state.decoder.lane()
                        continue
                    if state.parsing is None:
                        state.lane = state.decoder.lane()
                    tokens_in += len(ids)
                    self._item_output(rid, state, ids, result, deltas, finishes)
                if len(deltas) != before:
                    itemized.add(rid)
        self.tokens_in += tokens_in + single
        self.tokens_consumed += single
        self.chars_out += chars_out
        self.holds += holds

    def drop_all(self) -> list[str]:
        """Forget every live rid (worker shutting down); returns them."""
        rids = list(self.live)
        self.live.clear()
        self.live_stop_chars = 0
        return rids

    def _logprobs_item(self, item: Tokens, state: RidState, deltas: list[TextDelta], finishes: list[Finish]) -> None:
        """An item of a rid with logprobs: handled as one without them, then its consumed ids' entries (and any
        held ones) go on the delta it produced, or are held for the next."""
        try:
            entries = self.token_texts.texts(item.ids, item.logprobs) if item.logprobs is not None else []
        except Exception as exc:  # noqa: BLE001 - bad ids or a short logprobs list end only this rid
            self._end_with_error(item.rid, state, "", f"bad logprobs from the engine: {exc}", deltas, finishes)
            return
        held, state.logprobs = state.logprobs or [], None
        before = state.n_tokens
        plain = TokenBatch(0, 0, [], [Tokens(item.rid, item.ids, item.finish, item.error)])
        result = self.handle_batch(plain)
        finishes.extend(result.finishes)
        held += entries[: state.n_tokens - before]
        produced = text_deltas(result.text_batch)
        if produced:
            produced[-1].logprobs = held
            deltas.extend(produced)
        else:
            state.logprobs = held

    # ---- per message ----------------------------------------------------------------------------------

    def _open(self, open_: Open, deltas: list[TextDelta], finishes: list[Finish]) -> None:
        rid = open_.rid
        previous = self.live.pop(rid, None)  # a duplicate Open is a re-open: start over
        if previous is not None:
            self.live_stop_chars -= previous.stop_chars
        self._ended.discard(rid)
        params = open_.params
        try:
            rules = StopRules.from_params(params, self.stop_limits)
        except StopRuleError as exc:
            self._end_with_error(rid, RidState(decoder=None), "", str(exc), deltas, finishes, BAD_PARAMS)
            return
        stop_chars = sum(len(text) for text in params.stop)
        if stop_chars and self.live_stop_chars + stop_chars > self.max_live_stop_chars:
            message = (
                f"this detok worker holds stop strings of {self.live_stop_chars} characters for its live requests; "
                f"{stop_chars} more would pass its limit (worker.max_live_stop_chars = {self.max_live_stop_chars}): "
                "retry later, or use fewer or shorter stop strings"
            )
            self._end_with_error(rid, RidState(decoder=None), "", message, deltas, finishes, BAD_STOP_BUDGET)
            return
        try:
            parsing = parsing_for(params, self.tokenizer, open_.prompt_tail)
            decoder_config = rules.decoder_config()
            if parsing is not None:  # stop strings apply to the parsed content (worker/parsing.py)
                decoder_config = dataclasses.replace(decoder_config, stop_sequences=(), visible_stop_sequences=())
            decoder = StopSequenceDecoder(
                self.tokenizer,
                decoder_config,
                prompt_ids=open_.prompt_tail,
                skip_special_tokens=params.skip_special_tokens,
                min_tokens=params.min_tokens,
            )
        except Exception as exc:  # noqa: BLE001 - bad input (e.g. a bad prompt id) must end only this rid
            message = f"cannot open request: {exc}"
            self._end_with_error(rid, RidState(decoder=None), "", message, deltas, finishes, BAD_PARAMS)
            return
        lane = decoder.lane() if parsing is None else None
        self.live[rid] = RidState(decoder=decoder, parsing=parsing, stop_chars=stop_chars, lane=lane)
        self.live_stop_chars += stop_chars
