"""The pure part of a detok worker: the rid table and TokenBatch -> TextBatch (+ Finish messages to the engine).

No sockets, no clocks except what the caller passes in, so every rule is unit-testable:
- Open starts a rid (or, for a live rid, re-opens it: the state is replaced and the text starts again at offset 0;
  the front drops what it already delivered).
- Tokens for a live rid go through its StopSequenceDecoder; a delta is produced only when there is news (text or
  a finish). On a stop (string, stop token, EOS as a hidden stop token) the rid ends with finish "stop" and the
  engine gets a Finish; a bad token id ends only that rid with finish "error". An id the tokenizer lacks that the
  engine's model can emit (below Open.vocab_size) is a token without text, counted (unknown_ids), not an error. A
  Tokens item with finish set (EOS/max_tokens/abort decided by the engine) flushes and ends the rid with that finish.
- Tokens for a rid that ended recently are dropped silently; for a rid never opened they are counted as bad.
- Tokens with logprobs, and every id of a rid whose params ask for its token ids (only requests that asked), take a
  slower path beside the hot loop: the item is handled as if it had neither, then the entries and ids of the tokens
  it consumed ride on the delta it produced, or wait for the rid's next delta while its text is held back (an
  unfinished character, a possible stop string). So each delta carries the entries (ids) of the tokens consumed
  since the previous one, and their count is the rid's n_tokens.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from detok_worker.bus.columns import MISMATCHED_COLUMNS, add_delta, columns_ok, row_runs, text_deltas
from detok_worker.bus.messages import (
    Finish,
    Open,
    TextBatch,
    TokenBatch,
    Tokens,
)
from detok_worker.errors import ParameterError
from detok_worker.stream import StopSequenceDecoder
from detok_worker.stream.stop.rules import DEFAULT_STOP_LIMITS, StopLimits, StopRules
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.worker.endings import RecentlyEnded, RidEndings, RidState
from detok_worker.worker.logprobs import TokenTexts
from detok_worker.worker.open_plans import OpenPlan, OpenPlans, prepare_stops
from detok_worker.worker.parsing import parsing_for

log = logging.getLogger(__name__)

BAD_PARAMS = "bad_params"  # Open whose DetokParams break the configured limits
BAD_STOP_BUDGET = "stop_budget"  # Open refused: the live rids' stop strings would pass worker.max_live_stop_chars
DEFAULT_MAX_LIVE_STOP_CHARS = 4_194_304
RECENTLY_ENDED_CAPACITY = 16_384
# the counts a worker keeps for its metrics: each an attribute of WorkerState, counted where it happens
COUNTS = ("tokens_in", "tokens_consumed", "chars_out", "holds", "unknown_ids")
TICK_EVERY_ITEMS = 256  # items between calls of the worker's tick (its heartbeat timer) in a long batch


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
        self.open_plans = OpenPlans()  # what an Open derives from its params alone, per distinct params
        self._ended = RecentlyEnded(RECENTLY_ENDED_CAPACITY)
        self.bad: Counter[str] = Counter()
        # cumulative counts (COUNTS: the worker's metrics, read at the stats interval, never per token)
        self.tokens_in = 0
        self.chars_out = 0
        self.tokens_consumed = 0
        self.holds = 0  # rid steps that consumed ids but released no text yet (incomplete char / stop prefix)
        self.unknown_ids = 0  # ids the tokenizer lacks that the model can emit: consumed, no text
        self.stops: Counter[str] = Counter()  # rids ended by a stop rule found here: "string" or "token"

    @property
    def live_rids(self) -> int:
        return len(self.live)

    def counts(self) -> dict[str, int]:
        """The cumulative counts by name, each the worker metric of that name (metrics/recorders.WorkerMetrics)."""
        return {name: getattr(self, name) for name in COUNTS}

    def handle_batch(self, batch: TokenBatch, tick: Callable[[], None] | None = None) -> BatchResult:
        """One TokenBatch in, one TextBatch out. sent_ns/step are copied from the TokenBatch so the front can
        measure engine-to-front latency. `tick` (the worker's timers: heartbeats) is called after each Open and
        every TICK_EVERY_ITEMS rows, so a long batch cannot starve the worker's heartbeats.

        The rows in order: the plain ones (one id) are the hot path, _plain_rows; a row with extras goes through
        _item."""
        out = TextBatch(self.worker_id, batch.sent_ns, batch.step)
        finishes: list[Finish] = []
        for open_ in batch.opens:
            self._open(open_, out, finishes)
            if tick is not None:
                tick()
        if not columns_ok(batch):  # the frame decoder drops such frames: this is a caller's bug
            raise ValueError(MISMATCHED_COLUMNS)
        rids, ids, extras = batch.rids, batch.ids, batch.extras
        count = len(rids)
        for chunk in range(0, count, TICK_EVERY_ITEMS):
            if tick is not None and chunk:
                tick()
            chunk_end = min(chunk + TICK_EVERY_ITEMS, count)
            for start, end in row_runs(chunk, chunk_end, extras):
                if start < end:
                    self._plain_rows(rids[start:end], ids[start:end], out, finishes)
                if end < chunk_end:
                    self._item(rids[end], extras[end], out, finishes)
        return BatchResult(out, finishes)

    def _plain_rows(self, rids: list[str], ids: list[int], out: TextBatch, finishes: list[Finish]) -> None:
        """Plain rows in order, each id through its rid's decoder (StopSequenceDecoder.process_one: a table lookup
        first), plain text into `out`'s columns. Anything else goes through the slower paths, its delta into `out`
        as a row with extras: an unknown rid, every id of a rid whose deltas carry more than text (a parser, held
        logprobs, token ids: _item), and a stop or an error (the rid ends)."""
        live_get = self.live.get
        out_rids, out_offsets, out_texts, out_n_tokens = out.rids, out.offsets, out.texts, out.n_tokens
        chars_out = holds = aside = off_text = 0  # aside: ids handed to _item; off_text: ids that gave no str
        for rid, token_id in zip(rids, ids, strict=True):
            state = live_get(rid)
            if state is None or not state.plain:
                aside += 1
                self._item(rid, Tokens([token_id]), out, finishes)
                continue
            decoder = state.decoder
            try:
                text = decoder.process_one(token_id)
            except Exception as exc:  # noqa: BLE001 - a decoder failure ends only this rid
                off_text += 1
                self._end_with_error(rid, state, "", f"detokenization failed: {exc}", out, finishes)
                continue
            if text.__class__ is not str:  # a stop, a bad id (the rid ends), an id the tokenizer lacks (no text)
                off_text += 1
                self._item_output(rid, state, [token_id], text, out, finishes)
                continue
            if not text:
                holds += 1  # bytes of a character, or a possible stop string, held
                continue
            out_rids.append(rid)
            offset = state.offset
            out_offsets.append(offset)
            out_texts.append(text)
            out_n_tokens.append(decoder.num_generated)
            state.offset = offset + len(text)
            chars_out += len(text)
        self.tokens_in += len(rids) - aside
        self.tokens_consumed += len(rids) - aside - off_text
        self.chars_out += chars_out
        self.holds += holds

    def _item(self, rid: str, item: Tokens, out: TextBatch, finishes: list[Finish]) -> None:
        """One item (a row with extras, or a plain row off the hot loop) through the rid's decoder, its delta into
        `out`; endings and unknown rids go through _end_item."""
        state = self.live.get(rid)
        if state is not None and (item.logprobs is not None or state.held_ids is not None):
            self._entries_item(rid, item, state, out, finishes)
        elif state is None or item.finish is not None:
            if state is not None and state.logprobs:  # held entries go with the rid's last delta
                self._entries_item(rid, item, state, out, finishes)
            else:
                self._end_item(rid, item, state, out, finishes)
        else:
            self.tokens_in += len(item.ids)
            try:
                decoded = state.decoder.process_tokens(item.ids)
            except Exception as exc:  # noqa: BLE001 - a decoder failure ends only this rid
                self._end_with_error(rid, state, "", f"detokenization failed: {exc}", out, finishes)
                return
            self._item_output(rid, state, item.ids, decoded, out, finishes)

    def drop_all(self) -> list[str]:
        """Forget every live rid (worker shutting down); returns them."""
        rids = list(self.live)
        self.live.clear()
        self.live_stop_chars = 0
        return rids

    def _entries_item(self, rid: str, item: Tokens, state: RidState, out: TextBatch, finishes: list[Finish]) -> None:
        """An item of a rid with logprobs or token ids: handled as one without them, then its consumed ids' entries
        and ids (and any held ones) go on the delta it produced, or are held for the next."""
        try:
            logprobs, vocab_size = item.logprobs, state.decoder.model_vocab_size
            entries = []
            if logprobs is not None:
                if state.logprob_context is None:
                    state.logprob_context = []
                entries = self.token_texts.texts(item.ids, logprobs, vocab_size, state.logprob_context)
        except Exception as exc:  # noqa: BLE001 - bad ids or a short logprobs list end only this rid
            self._end_with_error(rid, state, "", f"bad logprobs from the engine: {exc}", out, finishes)
            return
        with_logprobs = logprobs is not None or bool(state.logprobs)
        held, state.logprobs = state.logprobs or [], None
        held_ids, state.held_ids = state.held_ids, None  # so that the plain pass below does not come back here
        before = state.n_tokens
        plain = TextBatch(self.worker_id, 0, 0)
        self._item(rid, Tokens(item.ids, item.finish, item.error), plain, finishes)
        consumed = state.n_tokens - before
        held += entries[:consumed]
        if held_ids is not None:
            held_ids += item.ids[:consumed]
        produced = text_deltas(plain)
        if produced:
            last = produced[-1]
            if with_logprobs:
                last.logprobs = held
            if held_ids is not None:
                last.token_ids, held_ids = held_ids, []
            for delta in produced:
                add_delta(out, delta)
        else:
            state.logprobs = held if with_logprobs else None
        state.held_ids = held_ids
        state.plain = state.parsing is None and held_ids is None and not state.logprobs

    # ---- per message ----------------------------------------------------------------------------------

    def _open(self, open_: Open, out: TextBatch, finishes: list[Finish]) -> None:
        rid = open_.rid
        previous = self.live.pop(rid, None)  # a duplicate Open is a re-open: start over
        if previous is not None:
            self.live_stop_chars -= previous.stop_chars
        self._ended.discard(rid)
        params = open_.params
        key = OpenPlans.key_of(params)
        plan = self.open_plans.get(key)  # kept only once every check below that reads the params alone passed
        try:
            rules = plan.rules if plan is not None else StopRules.from_params(params, self.stop_limits)
        except ParameterError as exc:
            self._end_with_error(rid, None, "", str(exc), out, finishes, BAD_PARAMS)
            return
        stop_chars = rules.stop_chars
        if stop_chars and self.live_stop_chars + stop_chars > self.max_live_stop_chars:
            message = (
                f"this detok worker holds stop strings of {self.live_stop_chars} characters for its live requests; "
                f"{stop_chars} more would pass its limit (worker.max_live_stop_chars = {self.max_live_stop_chars}): "
                "retry later, or use fewer or shorter stop strings"
            )
            self._end_with_error(rid, None, "", message, out, finishes, BAD_STOP_BUDGET)
            return
        try:
            parsing = parsing_for(rules, self.tokenizer, open_.prompt_tail)
            if plan is None:
                plan = OpenPlan(rules, prepare_stops(self.tokenizer, rules, parsing is not None))
                self.open_plans.add(key, plan)
            decoder = StopSequenceDecoder(
                self.tokenizer,
                plan.stops,
                prompt_ids=open_.prompt_tail,
                skip_special_tokens=params.skip_special_tokens,
                min_tokens=params.min_tokens,
                model_vocab_size=open_.vocab_size,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
        except Exception as exc:  # noqa: BLE001 - bad input (e.g. a bad prompt id) must end only this rid
            message = f"cannot open request: {exc}"
            self._end_with_error(rid, None, "", message, out, finishes, BAD_PARAMS)
            return
        held_ids: list[int] | None = [] if params.return_token_ids else None
        plain = parsing is None and held_ids is None
        self.live[rid] = RidState(decoder, parsing=parsing, stop_chars=stop_chars, held_ids=held_ids, plain=plain)
        self.live_stop_chars += stop_chars
