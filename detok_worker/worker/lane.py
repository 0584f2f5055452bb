"""A worker's per-rid record, and its hot loop: a TokenBatch's columns (one id per rid, bus/columns.py) stepped
by the rids' lanes.

A rid on its lane (StopSequenceDecoder.lane: no parser, no bytes pending, no stop string held) takes an id that is
a whole-character table hit, not a stop token and not able to start a stop string by a lookup, no call: its text
goes straight into the TextBatch's columns, its counters are kept on its RidState, and the decoder learns the count
(sync_generated) before its next call. Everything else leaves as a Tokens item for WorkerState._items.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from detok_worker.bus.messages import LogprobText, TextBatch, Tokens
from detok_worker.stream.stop.decoder import Lane
from detok_worker.worker.parsing import RidParsing

TICK_EVERY_ITEMS = 256  # items between calls of the worker's tick (its heartbeat timer) in a long batch


@dataclass(slots=True)
class RidState:
    decoder: Any  # StopSequenceDecoder
    offset: int = 0  # characters already emitted for this rid
    n_tokens: int = 0  # output tokens consumed (cumulative)
    parsing: RidParsing | None = None  # the request's reasoning / tool-call parsers, if it names any
    stop_chars: int = 0  # characters of its stop strings (counted against worker.max_live_stop_chars)
    logprobs: list[LogprobText] | None = None  # entries of consumed tokens whose text is still held back
    # the decoder's lane() while the request has no parser (see step_lanes): set after each call of the decoder,
    # None from the moment the decoder is synced for its next call
    lane: Lane | None = None


def step_lanes(
    live: dict[str, RidState], rids: list[str], ids: list[int], out: TextBatch, tick: Callable[[], None] | None
) -> tuple[list[Tokens], int, int, int]:
    """The lane over the batch's columns: plain text into `out`'s columns. Returns the entries it cannot take
    (not on a lane, not a whole-character table hit, a stop token, a possible stop string) as items, and the ids
    it stepped, characters it emitted and steps that emitted none. A rid sent off its lane stays off for the rest
    of the batch, so its later deltas follow in `items`."""
    live_get = live.get
    out_rids, out_offsets, out_texts, out_n_tokens = out.rids, out.offsets, out.texts, out.n_tokens
    slow: list[Tokens] = []
    chars_out = holds = stepped = 0
    for start in range(0, len(rids), TICK_EVERY_ITEMS):
        if tick is not None and start:
            tick()
        end = start + TICK_EVERY_ITEMS
        for rid, token_id in zip(rids[start:end], ids[start:end], strict=True):
            state = live_get(rid)
            if state is not None and (lane := state.lane) is not None:
                texts, stop_tokens, passthrough = lane
                try:
                    text = texts[token_id] if token_id >= 0 and token_id not in stop_tokens else None
                except (IndexError, TypeError):  # past the table, or not an id: process_one says why
                    text = None
                if text is not None and (passthrough is None or text in passthrough):
                    stepped += 1
                    n_tokens = state.n_tokens = state.n_tokens + 1
                    if text:
                        out_rids.append(rid)
                        out_offsets.append(state.offset)
                        out_texts.append(text)
                        out_n_tokens.append(n_tokens)
                        state.offset += len(text)
                        chars_out += len(text)
                    else:
                        holds += 1
                    continue
                state.decoder.sync_generated(state.n_tokens)  # the decoder learns the ids the lane stepped
                state.lane = None
            slow.append(Tokens(rid, [token_id]))
    return slow, stepped, chars_out, holds
