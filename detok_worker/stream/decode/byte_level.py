"""Byte-level fast path (ByteLevel BPE, tiktoken): decode(ids) is the UTF-8 decode, with replacement, of the
concatenated token bytes, so a stream only needs the bytes of an unfinished character.

Most steps are one table lookup (the token's bytes are complete UTF-8 and nothing is pending). Otherwise the pending
bytes plus the token's are split into their final text and the unfinished tail that stays pending (utf8.py: exactly
the bytes a continuation could still change, as Rust's from_utf8_lossy decides; a maximal invalid subpart becomes
U+FFFD as soon as it is known to be invalid).

Prompt: the bytes of an unfinished character at the end of the prompt stay pending, and the one character they
turn into (the completed character, or the one U+FFFD of an invalid maximal subpart) is the prompt's, so it is not
emitted. Skipped special tokens at the end of the prompt have no bytes: the search for those bytes walks past any
number of them.

Skipped special tokens that end the text before them (DecodeTables.text_enders, mistral-common's IGNORE policy)
decode the pending bytes as final: an unfinished character before one becomes U+FFFD at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok_worker.stream.decode.table_stream import TableDecodeStream
from detok_worker.stream.decode.tables import DecodeTables, FeedMemo, check_ids
from detok_worker.stream.decode.utf8 import decode_finished, unfinished_length

# Enough trailing prompt bytes to find an unfinished character (at most 3 bytes long) at the end of the prompt.
_PROMPT_TAIL_BYTES = 4
# Entries of a tables' feed memo before it is cleared (a few MB at most; partial-character tokens repeat a lot).
_FEED_MEMO_MAX = 16384


class ByteLevelDecodeStream(TableDecodeStream):
    """DecodeStream for byte-level tokenizers; see the module docstring."""

    __slots__ = ("_pieces", "_memo", "_text_enders", "pending", "_owed")
    byte_fallback = False

    def _setup(self, tables: DecodeTables, prompt_ids: Sequence[int]) -> None:
        self._pieces = tables.pieces
        self._memo = tables.feed_memo
        self._text_enders = tables.text_enders
        # bytes of an unfinished character; a caller stepping by the memo of lookup_tables() sets it
        self.pending = b""
        self._owed = 0  # 1 if the character the pending bytes become belongs to the prompt (or was flushed)
        if prompt_ids:
            self._start_from_prompt(prompt_ids)

    def _start_from_prompt(self, prompt_ids: Sequence[int]) -> None:
        tail: list[bytes] = []
        collected = 0
        pieces = self._pieces
        for position in range(len(prompt_ids) - 1, -1, -1):
            token_id = prompt_ids[position]
            if type(token_id) is not int or not 0 <= token_id < len(pieces) or pieces[token_id] is None:
                check_ids(self._decoding, (token_id,))  # the rule; the test above only skips it for a plain known id
            if token_id in self._text_enders:
                break  # the text before it is final
            piece = pieces[token_id]
            tail.append(piece)  # type: ignore[arg-type]  # check_ids: a known id
            collected += len(piece)  # type: ignore[arg-type]
            if collected >= _PROMPT_TAIL_BYTES:
                break
        data = b"".join(reversed(tail))
        self.pending = data[len(data) - unfinished_length(data) :]
        self._owed = 1 if self.pending else 0

    @property
    def tokens(self) -> tuple[int, ...]:
        return ()  # this path keeps the bytes of an unfinished character, never ids

    def lookup_tables(self) -> tuple[Sequence[str | None] | None, FeedMemo | None]:
        if self._owed:  # the pending bytes' character is the prompt's: step() strips it, a memo lookup would not
            return (None if self.pending else self._texts), None
        return self._texts, self._memo

    def step(self, token_id: int) -> str | None:
        if not self.pending and type(token_id) is int and token_id >= 0:
            try:
                text = self._texts[token_id]  # None for anything but a whole-character token (see DecodeTables)
            except IndexError:
                text = None
            if text is not None:
                return text
        return self._feed_id(token_id) or None

    def step_batch(self, ids: Sequence[int]) -> list[str]:
        if len(ids) == 1:
            return [self.step(ids[0]) or ""]
        check_ids(self._decoding, ids)
        texts = self._texts
        out: list[str] = []
        append = out.append
        for token_id in ids:
            if not self.pending:
                text = texts[token_id]
                if text is not None:
                    append(text)
                    continue
            append(self._feed_id(token_id))
        return out

    def pending_text(self) -> str:
        # pending bytes are an unfinished character: one U+FFFD, or nothing if it is the prompt's
        return "" if self._owed or not self.pending else "\ufffd"

    def flush(self) -> str | None:
        if not self.pending:
            return None
        text = self.pending_text()
        # The pending bytes stay, as the prompt's: a later id may still complete their character, and that
        # character was just shown (as U+FFFD) so it is not emitted again.
        self._owed = 1
        return text or None

    def _feed_id(self, token_id: int) -> str:
        """One id's step past the table, through the tables' shared memo: the text and the pending bytes after are a
        pure function of (pending bytes, id), and off-lookup steps (characters split across tokens) repeat a lot."""
        key = (self.pending, token_id)
        known = self._memo.get(key) if type(token_id) is int else None  # True == 1: only ints are memo keys
        if known is None:
            check_ids(self._decoding, (token_id,))
            data = self.pending + self._pieces[token_id]  # type: ignore[operator]
            # all of data is final when the id ends the text
            known = (data.decode("utf-8", "replace"), b"") if token_id in self._text_enders else decode_finished(data)
            if len(self._memo) >= _FEED_MEMO_MAX:
                self._memo.clear()
            self._memo[key] = known
        text, self.pending = known
        if self._owed and text:
            self._owed = 0
            return text[1:]
        return text
