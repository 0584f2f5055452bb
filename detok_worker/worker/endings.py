"""A worker's per-rid record (RidState), how a rid ends, and the decoder outputs that are not plain text: a stop
(string, stop token), a bad id, the engine's finish, a parsed request's step. The base of WorkerState (state.py):
the same per-rid table and counters, in their own module so the hot path (state.py) stays readable. RecentlyEnded:
the rids that ended here lately.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from detok_worker.bus.columns import add_delta
from detok_worker.bus.messages import (
    FINISH_ERROR,
    FINISH_REASONS,
    FINISH_STOP,
    Finish,
    LogprobText,
    ParsedDelta,
    TextBatch,
    TextDelta,
    Tokens,
)
from detok_worker.stream.stop.decoder import StopSequenceDecoder
from detok_worker.stream.stop.outputs import StopBatchOutput
from detok_worker.worker.parsing import RidParsing

log = logging.getLogger(__name__)

BAD_UNKNOWN_RID = "unknown_rid"  # Tokens for a rid this worker never opened
BAD_RID_ERROR = "rid_error"  # a rid ended with an error (bad token id, decoder failure)
ENGINE_ERROR = "the engine ended the request with an error"


class RecentlyEnded:
    """Bounded insertion-ordered set of rids that ended here, so their late tokens are dropped quietly."""

    def __init__(self, capacity: int) -> None:
        self._rids: dict[str, None] = {}
        self._capacity = capacity

    def add(self, rid: str) -> None:
        self._rids.pop(rid, None)
        self._rids[rid] = None
        if len(self._rids) > self._capacity:
            del self._rids[next(iter(self._rids))]

    def discard(self, rid: str) -> None:
        self._rids.pop(rid, None)

    def __contains__(self, rid: str) -> bool:
        return rid in self._rids


@dataclass(slots=True)
class RidState:
    """One live rid: its decoder (the text, the pending bytes and the stop state) and what the worker adds."""

    decoder: StopSequenceDecoder
    offset: int = 0  # characters already emitted for this rid
    parsing: RidParsing | None = None  # the request's reasoning / tool-call parsers, if it names any
    stop_chars: int = 0  # characters of its stop strings (counted against worker.max_live_stop_chars)
    logprobs: list[LogprobText] | None = None  # entries of consumed tokens whose text is still held back
    logprob_context: list[int] | None = None  # a rid with logprobs: its last sampled ids (logprobs.TokenTexts)
    # a rid whose params ask for its token ids: the ids consumed whose delta has not gone yet; None for the others
    held_ids: list[int] | None = None
    # its deltas are text only (no parser, no token ids, no logprobs held): its ids take the worker's hot loop
    plain: bool = True

    @property
    def n_tokens(self) -> int:
        """Output tokens consumed (cumulative): the decoder's count."""
        return self.decoder.num_generated


class RidEndings:
    """Endings and non-plain outputs of a worker's rids (WorkerState's table and counters)."""

    worker_id: str
    live: dict[str, RidState]
    live_stop_chars: int
    _ended: RecentlyEnded
    bad: Counter[str]
    stops: Counter[str]
    tokens_in: int
    tokens_consumed: int
    chars_out: int
    holds: int
    unknown_ids: int

    def _item_output(
        self,
        rid: str,
        state: RidState,
        ids: list[int],
        out: StopBatchOutput,
        deltas: TextBatch,
        finishes: list[Finish],
    ) -> None:
        """The output of an item the fused branch did not take (several ids, a parser, a stop, an error, an id the
        tokenizer lacks)."""
        self._consumed(state, ids, out)
        text = out.text
        if out.stopped or out.error is not None:
            self._end_decoded(rid, state, text, out.stop_reason, out.error, None, deltas, finishes)
        elif state.parsing is not None:
            self.chars_out += self._parsed_step(rid, state, text, deltas, finishes)
        elif text:
            add_delta(deltas, TextDelta(rid, state.offset, text, state.n_tokens))
            state.offset += len(text)
            self.chars_out += len(text)
        elif ids:
            self.holds += 1

    def _consumed(self, state: RidState, ids: list[int], out: StopBatchOutput) -> None:
        """What the decoder took of `ids` (up to a stop): the rid's and the worker's counts, and its parser's."""
        consumed = out.consumed
        self.tokens_consumed += consumed
        self.unknown_ids += out.unknown_ids
        if state.parsing is not None:
            state.parsing.count(ids[:consumed])

    def _parsed_step(self, rid: str, state: RidState, text: str, deltas: TextBatch, finishes: list[Finish]) -> int:
        """The item step of a request with parsers that the decoder did not end: the text's split goes with it; a
        stop string in the content ends the request. Returns the characters emitted."""
        if not text:
            return 0
        assert state.parsing is not None
        try:
            parsed, match = state.parsing.take(text, final=False)
        except Exception as exc:  # noqa: BLE001 - a parser failure ends only this rid
            state.parsing.failed = True
            self._end_with_error(rid, state, "", f"output parsing failed: {exc}", deltas, finishes)
            return 0
        if match is not None:
            self.stops["string"] += 1
            self._end(rid, state, text, FINISH_STOP, match.stop, deltas, parsed=parsed)
            finishes.append(Finish(rid, FINISH_STOP, match.stop, state.n_tokens))
            return 0
        add_delta(deltas, TextDelta(rid, state.offset, text, state.n_tokens, parsed=parsed))
        state.offset += len(text)
        return len(text)

    def _end_item(
        self, rid: str, item: Tokens, state: RidState | None, deltas: TextBatch, finishes: list[Finish]
    ) -> None:
        """A Tokens item that ends its rid (finish set by the engine) or whose rid is not live here."""
        if state is None:
            if rid not in self._ended:
                bad = self.bad[BAD_UNKNOWN_RID] = self.bad[BAD_UNKNOWN_RID] + 1
                if bad == 1 or bad % 1000 == 0:
                    log.warning("worker %s: %s (%d so far): %s", self.worker_id, BAD_UNKNOWN_RID, bad, rid)
            return
        self.tokens_in += len(item.ids)
        if item.finish not in FINISH_REASONS:
            message = f"the engine ended the request with an unknown finish reason {item.finish!r}"
            self._end_with_error(rid, state, "", message, deltas, finishes)
            return
        decoder = state.decoder
        try:
            out = decoder.process_tokens(item.ids)
            text, stop_reason, error = out.text, out.stop_reason, out.error
            self._consumed(state, item.ids, out)
            if not out.stopped and error is None:
                text += decoder.flush().text  # a stop string may still match in the flushed text
                stop_reason = decoder.stop_reason
        except Exception as exc:  # noqa: BLE001 - a decoder failure ends only this rid
            self._end_with_error(rid, state, "", f"detokenization failed: {exc}", deltas, finishes)
            return
        self._end_decoded(rid, state, text, stop_reason, error, item.finish, deltas, finishes, item.error)

    def _end_decoded(
        self,
        rid: str,
        state: RidState,
        text: str,
        stop_reason: str | int | None,
        error: str | None,
        engine_finish: str | None,
        deltas: TextBatch,
        finishes: list[Finish],
        engine_error: str | None = None,
    ) -> None:
        """The last delta of a rid: a bad id (error), a stop found here, or the engine's finish (`engine_error`:
        the engine's message when it failed the rid)."""
        if error is not None:
            self._end_with_error(rid, state, text, error, deltas, finishes)
        elif stop_reason is not None:
            self.stops["string" if isinstance(stop_reason, str) else "token"] += 1
            self._end(rid, state, text, FINISH_STOP, stop_reason, deltas)
            # the engine still generates this rid: tell it to stop; or it ended it (a rid with stop strings: the
            # engine waits for how it ended for the client)
            if engine_finish is None or state.stop_chars:
                finishes.append(Finish(rid, FINISH_STOP, stop_reason, state.n_tokens))
        elif engine_finish == FINISH_ERROR:
            self._end(rid, state, text, FINISH_ERROR, None, deltas, error=engine_error or ENGINE_ERROR, by_engine=True)
        else:
            self._end(rid, state, text, engine_finish or FINISH_STOP, None, deltas)
            if state.stop_chars and engine_finish is not None:  # the engine's end stands (see above)
                finishes.append(Finish(rid, engine_finish, None, state.n_tokens))

    def _end(
        self,
        rid: str,
        state: RidState | None,
        text: str,
        finish: str,
        stop_reason: str | int | None,
        deltas: TextBatch,
        error: str | None = None,
        parsed: ParsedDelta | None = None,
        by_engine: bool = False,
    ) -> None:
        """The rid's last delta; `state` None: a rid whose Open was refused (nothing decoded, not live); `by_engine`:
        the error is the engine's failure of the rid (the worker's own, e.g. a parser's, replaces it)."""
        if state is not None and state.parsing is not None and parsed is None:
            try:
                parsed, match = state.parsing.take(text, final=True)
            except Exception as exc:  # noqa: BLE001 - a parser failure ends only this rid
                state.parsing.failed = True
                parsed, _ = state.parsing.take("", final=True)
                text, finish, stop_reason, error = "", FINISH_ERROR, None, f"output parsing failed: {exc}"
                by_engine = False
                self._log_failed(rid, BAD_RID_ERROR, error)
            else:
                if match is not None and finish != FINISH_ERROR:  # a stop string in the last content
                    finish, stop_reason = FINISH_STOP, match.stop
        offset, n_tokens = (0, 0) if state is None else (state.offset, state.n_tokens)
        delta = TextDelta(
            rid,
            offset,
            text,
            n_tokens,
            finish=finish,
            stop_reason=stop_reason,
            error=error,
            parsed=parsed,
            engine_failed=by_engine or None,
        )
        add_delta(deltas, delta)
        self._ended.add(rid)
        if state is None:
            return
        self.chars_out += len(text)
        if self.live.pop(rid, None) is not None:
            self.live_stop_chars -= state.stop_chars

    def _end_with_error(
        self,
        rid: str,
        state: RidState | None,
        text: str,
        message: str,
        deltas: TextBatch,
        finishes: list[Finish],
        kind: str = BAD_RID_ERROR,
    ) -> None:
        self._log_failed(rid, kind, message)
        self._end(rid, state, text, FINISH_ERROR, None, deltas, error=message)
        finishes.append(Finish(rid, FINISH_ERROR, None, 0 if state is None else state.n_tokens))

    def _log_failed(self, rid: str, kind: str, message: str) -> None:
        self.bad[kind] += 1
        # one line per failed request (not rate-limited like bad frames): it names the rid, whose middle part is
        # the client's X-Request-Id, so a request can be followed from the front's access log to here
        log.warning("worker %s: rid %s failed (%s, %d so far): %s", self.worker_id, rid, kind, self.bad[kind], message)
