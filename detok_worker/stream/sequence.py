"""Sequence: a growing token sequence with its text, on the same DecodeStream the workers run.

Unlike a DecodeStream (which keeps only a few ids of context), a Sequence keeps every id: it is the whole
sequence, e.g. a conversation that grows by generated tokens and by appended text (tool results, templates).
"""

from __future__ import annotations

from collections.abc import Sequence as IdSequence

from detok_worker.stream.decode.select import create_decode_stream
from detok_worker.tokenizer.protocol import Tokenizer


class Sequence:
    """Token ids plus incremental text. Invariant: text() == tokenizer.decode(token_ids, skip_special_tokens).

    append_token(id) returns only the text that id completes (a character split over several ids appears once,
    at the id that completes it; what is still incomplete shows in text() as U+FFFD until then).
    append_text(text) encodes text (no special tokens added) and appends its ids; that text is part of text()
    but is returned by no append_token call.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        token_ids: IdSequence[int] = (),
        *,
        skip_special_tokens: bool = False,
        force_generic: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stream = create_decode_stream(tokenizer, (), skip_special_tokens, force_generic=force_generic)
        self._token_ids: list[int] = []
        self._parts: list[str] = []  # text no longer pending, in order
        self._extend(token_ids)

    @property
    def fast_path(self) -> bool:
        return self._stream.fast_path

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(self._token_ids)

    def __len__(self) -> int:
        return len(self._token_ids)

    def append_text(self, text: str) -> None:
        """Encode `text` and append its ids (its text is context: no append_token call returns it)."""
        self._extend(self._tokenizer.encode(text).ids)

    def append_token(self, token_id: int) -> str:
        """Append one id; return the text it completes ('' if none). Raises InvalidTokenIdError (nothing appended)."""
        text = self._stream.step(token_id) or ""
        self._token_ids.append(token_id)
        if text:
            self._parts.append(text)
        return text

    def text(self) -> str:
        """The whole text: decode(token_ids), an incomplete character at the end shown as U+FFFD."""
        if len(self._parts) > 1:
            self._parts[:] = ["".join(self._parts)]
        return (self._parts[0] if self._parts else "") + self._stream.pending_text()

    def _extend(self, ids: IdSequence[int]) -> None:
        texts = self._stream.step_batch(ids)  # raises (nothing appended) on a bad id
        self._token_ids.extend(ids)
        self._parts.extend(text for text in texts if text)
