"""Token strings and bytes for the logprobs a request asked for (the engine sends ids and values only).

Per id, as the client sees it (docs/http_api.md, "logprobs"):
- `token`: the token string of stream/decode/token_strings.py (vLLM's rule: the decode of that id alone, special
  tokens kept, a SentencePiece word piece's leading space kept), with the rid's last sampled tokens as the context
  that completes a split character: a token that holds only part of a character gives "", the one that completes it
  the whole character.
- `bytes`: the token's own bytes as they appear in the output (OpenAI's rule): the piece of a character for a
  token that splits one, so the bytes of consecutive tokens join into the output's UTF-8. They come from the
  tokenizer's verified byte table (detok_worker/stream/decode/fast_path.py); a tokenizer without one gives the
  UTF-8 of the id's token string alone (vLLM's rule).
Both are cached per id: a request with logprobs decodes each distinct id once per worker (a split character's
completion again per place). An id the tokenizer lacks that the engine's model can emit (below its vocabulary size)
has no text: "" and no bytes (NO_TEXT).
"""

from __future__ import annotations

from operator import itemgetter

from detok_worker.bus.messages import LogprobText, TokenLogprob
from detok_worker.stream.decode import byte_decoding_for
from detok_worker.stream.decode.token_strings import CONTEXT_TOKENS, REPLACEMENT, TokenStrings
from detok_worker.tokenizer.protocol import InvalidTokenIdError, Tokenizer, is_int_id

NO_TEXT = ("", b"")  # the entry of an id the tokenizer lacks but the model can emit


class TokenTexts:
    """id -> (token string, token bytes) of one tokenizer, built lazily (only requests with logprobs use it)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}
        self._pieces: list[bytes | None] | None = None
        self._byte_values: list[int] | None = None
        self._strings = TokenStrings(tokenizer)
        self._loaded = False

    def of(self, token_id: int, model_vocab_size: int = 0) -> tuple[str, bytes]:
        """(token string, token bytes) of an id; NO_TEXT for one the tokenizer lacks below `model_vocab_size` (the
        engine's vocabulary size, 0: not known), which is not cached: another engine's request may not know it."""
        found = self._cache.get(token_id)
        if found is not None:
            return found
        if not self._loaded:
            decoding = byte_decoding_for(self.tokenizer)
            if decoding is not None:
                self._pieces, self._byte_values = decoding.keep.pieces, decoding.keep.byte_values
            self._loaded = True
        try:
            self._strings.check([token_id])
            token = self._strings.of(token_id)
        except InvalidTokenIdError:
            if is_int_id(token_id) and 0 <= token_id < model_vocab_size:
                return NO_TEXT
            raise
        data: bytes | None = None
        if self._byte_values is not None and self._byte_values[token_id] >= 0:
            data = bytes([self._byte_values[token_id]])
        elif self._pieces is not None:
            data = self._pieces[token_id]
        found = (token, data if data is not None else token.encode("utf-8"))
        self._cache[token_id] = found
        return found

    def texts(
        self, ids: list[int], logprobs: list[TokenLogprob], model_vocab_size: int = 0, context: list[int] | None = None
    ) -> list[LogprobText]:
        """The client's entries for `ids` (aligned with `logprobs`); top candidates sorted most likely first.
        `model_vocab_size`: the engine's vocabulary size (see `of`). `context`: the rid's sampled ids before `ids`
        (the last CONTEXT_TOKENS count), which this call extends with `ids` and trims."""
        if context is None:
            context = []
        entries = []
        for token_id, entry in zip(ids, logprobs, strict=True):
            ranked = sorted(zip(entry.top_logprobs, entry.top_ids, strict=True), key=itemgetter(0), reverse=True)
            top = [
                LogprobText(*self._at(top_id, context, model_vocab_size), value, token_id=top_id)
                for value, top_id in ranked
            ]
            entries.append(LogprobText(*self._at(token_id, context, model_vocab_size), entry.logprob, top, token_id))
            context.append(token_id)
        del context[:-CONTEXT_TOKENS]
        return entries

    def _at(self, token_id: int, context: list[int], model_vocab_size: int) -> tuple[str, bytes]:
        """(token string at its place after `context`, token bytes)."""
        token, data = self.of(token_id, model_vocab_size)
        if token.endswith(REPLACEMENT):
            return self._strings.at(token_id, context), data
        return token, data
