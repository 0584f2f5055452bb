"""A worker's per-rid record, and its hot loop: a TokenBatch's columns (one id per rid, bus/columns.py) stepped
by the rids' lanes.

A rid on its lane (StopSequenceDecoder.lane: no parser) takes an id by lookups, no call: a whole-character table
hit while no bytes are pending, else (byte-level streams) a hit in the stream's memo of (pending bytes, id) steps;
not a stop token; and a text that passes the stop strings unchanged, else one whose memoised stop-string scan has no
match. Its text goes straight into the TextBatch's columns, its counters are kept on its RidState and the pending
bytes and stop state in its lane, and the decoder learns them (RidState.leave_lane) before its next call. Every
other entry goes to the decoder in its place (WorkerState.handle_batch's off_lane), so a rid's deltas keep their
order; plain text from either goes to the columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from detok_worker.bus.messages import LogprobText, TextBatch
from detok_worker.stream.stop.decoder import Lane, StopSequenceDecoder, lane_passthrough
from detok_worker.stream.stop.matcher import LaneScan
from detok_worker.worker.parsing import RidParsing

TICK_EVERY_ITEMS = 256  # items between calls of the worker's tick (its heartbeat timer) in a long batch


@dataclass(slots=True)
class RidState:
    decoder: StopSequenceDecoder
    offset: int = 0  # characters already emitted for this rid
    n_tokens: int = 0  # output tokens consumed (cumulative)
    parsing: RidParsing | None = None  # the request's reasoning / tool-call parsers, if it names any
    stop_chars: int = 0  # characters of its stop strings (counted against worker.max_live_stop_chars)
    logprobs: list[LogprobText] | None = None  # entries of consumed tokens whose text is still held back
    logprob_context: list[int] | None = None  # a rid with logprobs: its last sampled ids (logprobs.TokenTexts)
    # a rid whose params ask for its token ids (never on the lane): the ids consumed whose delta has not gone yet;
    # None for the others
    held_ids: list[int] | None = None
    # the decoder's lane() while the request has no parser (see step_lanes): set after each call of the decoder,
    # with the bytes pending and the stop state replaced as the lane steps; None once the decoder is synced
    lane: Lane | None = None

    def leave_lane(self) -> None:
        """Before the decoder's next call: it learns the ids its lane stepped, the bytes pending and the stop state."""
        if (lane := self.lane) is not None:
            self.decoder.sync_lane(self.n_tokens, lane)
            self.lane = None


# (rid, id, the rid's state or None) -> the plain text to emit, or None: an entry the lane cannot take
OffLane = Callable[[str, int, RidState | None], str | None]


def step_lanes(
    live: dict[str, RidState],
    rids: list[str],
    ids: list[int],
    out: TextBatch,
    tick: Callable[[], None] | None,
    off_lane: OffLane,
) -> tuple[int, int, int]:
    """The batch's columns in order: a rid on its lane takes its id by a lookup; any other entry goes to
    `off_lane` (the decoder), which returns the plain text to emit, or None (nothing yet, or it emitted an item
    itself). Plain text goes to `out`'s columns. Returns the ids the lane stepped, the characters emitted and the
    lane steps that emitted none."""
    live_get = live.get
    out_rids, out_offsets, out_texts, out_n_tokens = out.rids, out.offsets, out.texts, out.n_tokens
    chars_out = holds = stepped = 0
    for start in range(0, len(rids), TICK_EVERY_ITEMS):
        if tick is not None and start:
            tick()
        end = start + TICK_EVERY_ITEMS
        for rid, token_id in zip(rids[start:end], ids[start:end], strict=True):
            state = live_get(rid)
            text = None
            if state is not None and (lane := state.lane) is not None:
                texts, stop_tokens, passthrough, memo, pending, scan = lane
                after = pending
                if token_id not in stop_tokens:
                    if not pending:
                        try:
                            text = texts[token_id] if token_id >= 0 else None
                        except (IndexError, TypeError):  # past the table, or not an id: process_one says why
                            text = None
                    if text is None and memo is not None and (known := memo.get((pending, token_id))) is not None:
                        text, after = known
                if text is not None and (passthrough is None or text in passthrough):
                    if after is not pending:
                        state.lane = (texts, stop_tokens, passthrough, memo, after, scan)
                elif text is not None and (scanned := _scan_step(scan, text)) is not None:
                    scan, text = scanned
                    state.lane = (texts, stop_tokens, lane_passthrough(scan), memo, after, scan)
                else:
                    text = None
                    state.leave_lane()
                if text is not None:
                    stepped += 1
                    state.n_tokens += 1
                    if not text:
                        holds += 1
                        continue
            if text is None:
                text = off_lane(rid, token_id, state)
                if text is None:
                    continue
                assert state is not None
            out_rids.append(rid)
            out_offsets.append(state.offset)
            out_texts.append(text)
            out_n_tokens.append(state.n_tokens)
            state.offset += len(text)
            chars_out += len(text)
    return stepped, chars_out, holds


def _scan_step(scan: LaneScan | None, text: str) -> tuple[LaneScan, str] | None:
    """The lane's stop-string scan after `text` and the text it releases, when the filter's memoised scan of `text`
    from the lane's state has no match; None otherwise (no stop strings, not memoised, or a match)."""
    if scan is None:
        return None
    memo, root_passthrough, state = scan
    if (by_text := memo.get(state)) is None or (result := by_text.get(text)) is None:
        return None
    end_state, released, match_end, _ = result
    if match_end >= 0:
        return None
    return (memo, root_passthrough, end_state), released
