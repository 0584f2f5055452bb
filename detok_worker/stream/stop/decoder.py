"""StopSequenceDecoder: a DecodeStream plus stop tokens and stop strings, as the worker runs it per request.

Rules:
- Stop tokens are checked before stop strings: a stop token's own text never completes a stop string. A hidden
  stop token releases the text before it and never its own text; a visible one appends its own text decoded in
  context by the request's stream. The text before a stop token ends where the token starts: what the stream still
  withheld (an incomplete character becomes U+FFFD, as decode() gives it) is released and, like all text before
  the token, goes through the stop strings.
- Among stop strings the match that ends earliest wins, ties go to the one that starts earliest; a hidden match
  truncates the output before the match, a visible one after it. Nothing after a stop is ever emitted.
- Only the longest suffix that is still a proper prefix of some stop string is held back; the rest is released in
  the same call. Matching works on the stream's text, which only ever holds whole characters.
- min_tokens: stop checks (strings and tokens) apply from the (min_tokens + 1)-th generated token on; a stop string
  that starts earlier but ends there is found, and possible starts of a stop string are held back meanwhile.
- Text the stream only releases at flush() is still subject to stop strings.
- model_vocab_size (the engine's vocabulary, when its model can emit ids its tokenizer lacks): such an id is a
  generated token (min_tokens, consumed) whose text is nothing; the stream never sees it, exactly as the tokenizer's
  full decode drops it, so the bytes of a character split across it still join.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from detok_worker.errors import ParameterError
from detok_worker.stream.decode.base import DecodeStream
from detok_worker.stream.decode.byte_level import ByteLevelDecodeStream
from detok_worker.stream.decode.select import create_decode_stream
from detok_worker.stream.decode.tables import FeedMemo
from detok_worker.stream.stop.matcher import ROOT, ScanResult, StopStringFilter, compile_stop_strings
from detok_worker.stream.stop.outputs import (
    HELD,
    ONE_UNKNOWN_ID,
    StopBatchOutput,
    StopOutput,
    Stopped,
    StoppedWithText,
    StopReason,
    Text,
)
from detok_worker.stream.stop.settings import PreparedStops, StopSequenceConfig, check_min_tokens
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, is_count, is_int_id


class StopSequenceDecoder:
    """One request's streaming text with stop rules applied. Owns its DecodeStream."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: StopSequenceConfig | PreparedStops,
        *,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = False,
        min_tokens: int = 0,
        model_vocab_size: int = 0,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        """`config` checked against `tokenizer` here, or prepared by PreparedStops.check (for that tokenizer).
        `model_vocab_size`: the engine's vocabulary size; an id below it that the tokenizer lacks has no text (see
        the module docstring); 0: every id the tokenizer lacks is an error. `spaces_between_special_tokens`: vLLM's
        option (stream/decode/added_tokens.py)."""
        check_min_tokens(min_tokens)
        if not is_count(model_vocab_size):
            raise ParameterError(f"model_vocab_size must be an int >= 0, got {model_vocab_size!r}")
        stops = config if isinstance(config, PreparedStops) else PreparedStops.check(tokenizer, config)
        if stops.tokenizer is not tokenizer:
            raise ParameterError("the prepared stop settings were checked against another tokenizer")
        self._tokenizer = tokenizer
        self._config = config = stops.config
        self._prompt_ids = tuple(prompt_ids)
        self._skip_special_tokens = skip_special_tokens
        self._spaces_between_special_tokens = spaces_between_special_tokens
        self._min_tokens = min_tokens
        self._model_vocab_size = model_vocab_size
        self._visible_stop_tokens = stops.visible_stop_tokens
        self._stop_tokens = stops.stop_tokens
        self._filter: StopStringFilter | None = None
        self._passes: AbstractSet[str] | None = None  # the automaton's root passthrough and memo of scans
        self._scans: Mapping[int, Mapping[str, ScanResult]] = {}
        if config.stop_sequences or config.visible_stop_sequences:
            automaton = compile_stop_strings(config.stop_sequences, config.visible_stop_sequences)
            self._filter = StopStringFilter(automaton)
            self._passes, self._scans = automaton.root_passthrough, automaton.memo
        self._stop_reason: StopReason | None = None
        self._last_error: InvalidTokenIdError | None = None
        # What process_one steps the stream by instead of calling it (DecodeStream.lookup_tables), renewed after
        # every other step (_renew_lookups); none once stopped. _table: its table; _memo and _memo_stream (the
        # byte-level stream, whose `pending` bytes the memo steps): its memo, or None; _texts: _table while no
        # bytes are pending and the stop strings are at their root (the first branch), else None.
        self._table: Sequence[str | None] | None = None
        self._memo: FeedMemo | None = None
        self._memo_stream: ByteLevelDecodeStream | None = None
        self._texts: Sequence[str | None] | None = None
        self.reset()

    @property
    def config(self) -> StopSequenceConfig:
        return self._config

    @property
    def model_vocab_size(self) -> int:
        """The engine's vocabulary size given at construction (0: not known)."""
        return self._model_vocab_size

    @property
    def stopped(self) -> bool:
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> StopReason | None:
        """The stop string or stop token id that stopped the request; None while it runs."""
        return self._stop_reason

    @property
    def held_text(self) -> str:
        """Text held back because it may be the start of a stop string."""
        return self._filter.held if self._filter is not None else ""

    def reset(self) -> None:
        """Start over as if freshly built (same tokenizer, config, prompt and options)."""
        self._stream: DecodeStream = create_decode_stream(
            self._tokenizer,
            self._prompt_ids,
            self._skip_special_tokens,
            spaces_between_special_tokens=self._spaces_between_special_tokens,
        )
        if self._filter is not None:
            self._filter.reset()
        self.num_generated = 0  # generated tokens processed so far (including a stop token); read-only outside
        self._stop_reason = None
        self._renew_lookups()

    def process_token(self, token_id: int) -> StopOutput:
        """Process one generated id. Raises InvalidTokenIdError (state unchanged) for an id the tokenizer lacks, unless
        the model can emit it (model_vocab_size): that one is Held, no text."""
        result = self.process_tokens((token_id,))
        if result.error is not None:
            raise self._last_error
        if result.stopped:
            return StoppedWithText(result.text, result.stop_reason) if result.text else Stopped(result.stop_reason)
        return Text(result.text) if result.text else HELD

    def process_tokens(self, ids: Sequence[int]) -> StopBatchOutput:
        """Process one engine step's new ids for this request (see StopBatchOutput). The worker's hot path: the
        common case (no stop token among the ids) is one stream call and one filter call. An id the tokenizer lacks
        but the model can emit takes the slow path: _process_past_unknown."""
        self._texts = self._table = None  # process_one renews them on its next call
        result = self._process(ids)
        if result.error is None or not self._model_vocab_size:
            return result
        return self._process_past_unknown(ids, result)

    def _process(self, ids: Sequence[int]) -> StopBatchOutput:
        """process_tokens, except that it ends at any id the tokenizer lacks."""
        if self._stop_reason is not None:
            return StopBatchOutput("", True, self._stop_reason, 0)
        stop_tokens = self._stop_tokens
        if stop_tokens and not stop_tokens.isdisjoint(ids):
            first_checked = max(self._min_tokens - self.num_generated, 0)  # the first id whose stop token counts
            stop_index = next((k for k in range(first_checked, len(ids)) if ids[k] in stop_tokens), -1)
            if stop_index >= 0:
                return self._process_with_stop_token(ids, stop_index)
        try:
            texts = self._stream.step_batch(ids)
        except InvalidTokenIdError as error:
            return self._process_until_invalid(ids, error)
        stop_filter = self._filter
        if stop_filter is None:
            self.num_generated += len(ids)
            return StopBatchOutput(texts[0] if len(texts) == 1 else "".join(texts), False, None, len(ids))
        text, index, match = stop_filter.feed(texts, self._min_tokens - self.num_generated)
        if match is None:
            self.num_generated += len(ids)
            return StopBatchOutput(text, False, None, len(ids))
        self.num_generated += index + 1
        self._stop_reason = match.stop
        return StopBatchOutput(text, True, match.stop, index + 1)

    def process_one(self, token_id: int) -> str | StopBatchOutput:
        """process_tokens((token_id,)) without building a StopBatchOutput in the common case (the worker's one id
        per request per step): the text released (maybe ""), or a StopBatchOutput when the request stops, the id is
        bad or the tokenizer lacks it (unknown_ids: the model can emit it). `token_id` is an int (the bus's frame
        decoder refuses anything else; the lookups take a bool as its int value, process_tokens refuses it).

        Lookups first, no call, exactly what _step_one would do when all are found: the first branch is the
        stream's table (no bytes pending) and the stop strings' root passthrough set; the second the table or
        (byte-level) the stream's memo of (pending bytes, id) steps, and the passthrough set or the automaton's
        memo of scans that do not match. Anything else (a stop token, a stopped request, a miss) takes _step_one."""
        texts = self._texts
        if texts is not None and token_id not in self._stop_tokens:
            try:
                text = texts[token_id] if token_id >= 0 else None
            except (IndexError, TypeError):  # past the table, or not an id: _step_one says why
                text = None
            if text is not None and ((passes := self._passes) is None or text in passes):
                self.num_generated += 1
                return text
        if (table := self._table) is not None and token_id not in self._stop_tokens:
            stream = self._memo_stream
            pending = after = stream.pending if stream is not None else b""
            text = None
            if not pending:
                try:
                    text = table[token_id] if token_id >= 0 else None
                except (IndexError, TypeError):
                    text = None
            if text is None and stream is not None and (known := self._memo.get((pending, token_id))) is not None:  # type: ignore[union-attr]
                text, after = known
            stop_filter = self._filter
            if text is not None and stop_filter is not None:
                state = stop_filter.state
                if not (state == ROOT and text in self._passes):  # type: ignore[operator]
                    scan = by_text.get(text) if (by_text := self._scans.get(state)) is not None else None
                    if scan is None or scan[2] >= 0:  # not memoised, or a match
                        text = None
                    else:
                        stop_filter.state, text = scan[0], scan[1]
            if text is not None:
                if after is not pending:
                    stream.pending = after  # type: ignore[union-attr]
                self.num_generated += 1
                at_root = stop_filter is None or stop_filter.state == ROOT
                self._texts = table if not after and at_root else None
                return text
        result = self._step_one(token_id)
        self._renew_lookups()
        return result

    def _renew_lookups(self) -> None:
        """process_one's lookups for the state now (none once stopped)."""
        self._table = self._memo = self._memo_stream = self._texts = None
        if self._stop_reason is not None:
            return
        stream = self._stream
        self._table, self._memo = stream.lookup_tables()
        if self._memo is not None:
            assert isinstance(stream, ByteLevelDecodeStream)
            self._memo_stream = stream
            if stream.pending:
                return
        if self._filter is None or self._filter.state == ROOT:
            self._texts = self._table

    def _step_one(self, token_id: int) -> str | StopBatchOutput:
        """process_one past its lookups: a stop token, a stopped request or an id the stream refuses go through
        process_tokens unchanged; else the stream steps and the filter scans its text."""
        if self._stop_reason is not None or token_id in self._stop_tokens:
            return self.process_tokens((token_id,))
        try:
            text = self._stream.step(token_id) or ""
        except InvalidTokenIdError:  # the stream is unchanged: process_tokens reports it
            if self._model_can_emit(token_id):
                self.num_generated += 1
                return ONE_UNKNOWN_ID
            return self.process_tokens((token_id,))
        stop_filter = self._filter
        self.num_generated += 1
        if stop_filter is None:
            return text
        text, _, match = stop_filter.feed((text,), self._min_tokens - self.num_generated + 1)
        if match is None:
            return text
        self._stop_reason = match.stop
        return StopBatchOutput(text, True, match.stop, 1)

    def flush(self) -> Text | Stopped | StoppedWithText:
        """End of the request: release the held text and the stream's pending text (stop strings still apply)."""
        self._texts = self._table = None  # process_one renews them on its next call
        if self._stop_reason is not None:
            return Stopped(self._stop_reason)
        text, reason = self._finish_stream()
        if reason is not None:
            self._stop_reason = reason
            return StoppedWithText(text, reason) if text else Stopped(reason)
        return Text(text)

    def _process_with_stop_token(self, ids: Sequence[int], stop_index: int) -> StopBatchOutput:
        """process_tokens for ids whose stop_index-th id is a stop token that counts."""
        result = self.process_tokens(ids[:stop_index])  # holds no stop token that counts
        if result.stopped or result.error is not None:  # a stop string before the stop token, or a bad id
            return result
        token_id = ids[stop_index]
        # The text before the stop token ends here: the stream's pending text (an incomplete character becomes
        # U+FFFD) still goes through the stop strings. Only then the token's own text, if visible, in context.
        text, reason = self._finish_stream()
        if reason is None:
            reason = token_id
            if token_id in self._visible_stop_tokens:
                text += self._stop_token_text(token_id)
        self.num_generated += 1
        self._stop_reason = reason
        return StopBatchOutput(result.text + text, True, reason, result.consumed + 1, None, result.unknown_ids)

    def _finish_stream(self) -> tuple[str, StopReason | None]:
        """Flush the stream through the stop strings and release everything held; returns (text, matched string)."""
        pending = self._stream.flush() or ""
        if self._filter is None:
            return pending, None
        text, match = self._filter.feed_one(pending, self.num_generated > self._min_tokens)
        if match is not None:
            return text, match.stop
        return text + self._filter.release(), None

    def _stop_token_text(self, token_id: int) -> str:
        """A visible stop token's text, decoded by the stream after the text before it (so a leading space that
        depends on context is kept)."""
        try:
            text = self._stream.step(token_id) or ""
        except InvalidTokenIdError:  # in range but unknown to the tokenizer: it has no text to show
            return ""
        return text + (self._stream.flush() or "")

    def _process_past_unknown(self, ids: Sequence[int], result: StopBatchOutput) -> StopBatchOutput:
        """process_tokens for ids of which _process gave `result`, an error: while its bad id is one the model can
        emit (below model_vocab_size), that id is a generated token without text and the ids after it go on."""
        done, texts, unknown = result.consumed, [result.text], result.unknown_ids
        error = result.error
        while error is not None:
            bad = self._last_error
            assert bad is not None  # set with every error
            if not self._model_can_emit(bad.token_id):
                if self._model_vocab_size > self._tokenizer.vocab_size:  # the valid ids are the model's: say so
                    self._last_error = InvalidTokenIdError(bad.token_id, self._model_vocab_size, "the model")
                    error = str(self._last_error)
                break
            if result.stopped:  # a stop string ended the request before that id
                error = None
                break
            self.num_generated += 1  # ids[done] is that id: the stream never sees it
            unknown += 1
            done += 1
            if done == len(ids):
                return StopBatchOutput("".join(texts), False, None, done, None, unknown)
            result = self._process(ids[done:])
            texts.append(result.text)
            done += result.consumed
            unknown += result.unknown_ids
            error = result.error
        return StopBatchOutput("".join(texts), result.stopped, result.stop_reason, done, error, unknown)

    def _model_can_emit(self, token_id: object) -> bool:
        """Whether an id the stream refused is one the model can emit: no text (see model_vocab_size)."""
        return is_int_id(token_id) and 0 <= token_id < self._model_vocab_size  # type: ignore[operator]

    def _process_until_invalid(self, ids: Sequence[int], error: InvalidTokenIdError) -> StopBatchOutput:
        """Process the ids before the first bad one, then report the error; nothing after it is processed."""
        self._last_error = error
        # The stream rejects a batch as a whole and names its first bad id.
        valid = list(ids).index(error.token_id) if error.token_id in ids else 0
        result = self.process_tokens(ids[:valid]) if valid else StopBatchOutput("")
        return StopBatchOutput(result.text, result.stopped, result.stop_reason, result.consumed, str(error))
