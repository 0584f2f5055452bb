"""The string one token id stands for in logprobs (`token`, prompt logprobs' `decoded_token`), by vLLM's rule
(`convert_ids_list_to_tokens`, then its logprobs processor's correction):
- the tokenizer's decode of the id alone, special tokens kept, with the leading spaces that decode strips from a piece
  that starts with a word-start marker put back (SentencePiece's "▁Hello" decodes alone to "Hello"; its token string
  is " Hello", as OpenAI's tokens read). A tokenizer without such a marker (byte-level BPE, tiktoken) keeps its
  decode as it is;
- a token whose string ends with U+FFFD (it holds part of a character) is decoded again after the one to four
  tokens before its position, and gives the text it adds: the rest of the character it completes, or "" while it
  completes none. So the tokens of a split character give "" then the whole character.
An id the tokenizer lacks (a model's vocabulary is often padded past it) decodes to nothing, as Hugging Face's decode
leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok_worker.stream.decode.generic import common_prefix_length
from detok_worker.stream.decode.select import decode_text
from detok_worker.tokenizer.protocol import InvalidTokenIdError, MarksWordStarts, Tokenizer, WrapsTokenizer, id_check

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 4  # vLLM's: enough preceding tokens for any UTF-8 character


def word_start_marker(tokenizer: Tokenizer) -> str | None:
    """The marker character of the tokenizer's pieces (that of the tokenizer a wrapper wraps), or None."""
    while isinstance(tokenizer, WrapsTokenizer) and tokenizer.inner is not tokenizer:
        tokenizer = tokenizer.inner
    return tokenizer.word_start_marker() if isinstance(tokenizer, MarksWordStarts) else None


class TokenStrings:
    """The token strings of one tokenizer, each id's computed once (`of`), and the string of a token at its place
    in a sequence (`at`)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.check = id_check(tokenizer)  # the tokenizer's id rule (raises InvalidTokenIdError)
        self._marker = word_start_marker(tokenizer)
        self._single: dict[int, str] = {}

    def of(self, token_id: int) -> str:
        """The id's token string alone (U+FFFD at its end for a token that holds part of a character)."""
        text = self._single.get(token_id)
        if text is None:
            text = self._single[token_id] = self._with_leading_spaces(token_id, self.decode([token_id]))
        return text

    def at(self, token_id: int, context: Sequence[int]) -> str:
        """The token string of `token_id` following the ids `context` (the tokens before its position, oldest
        first; only the last CONTEXT_TOKENS count)."""
        text = self.of(token_id)
        return self._completed(token_id, context) if text.endswith(REPLACEMENT) else text

    def decode(self, ids: Sequence[int]) -> str:
        """The decode of `ids`, special tokens kept, ids the tokenizer lacks left out."""
        try:
            return decode_text(self.tokenizer, ids)
        except InvalidTokenIdError:
            return decode_text(self.tokenizer, [token_id for token_id in ids if self._known(token_id)])

    def _known(self, token_id: int) -> bool:
        try:
            self.check([token_id])
        except InvalidTokenIdError:
            return False
        return True

    def _with_leading_spaces(self, token_id: int, decoded: str) -> str:
        """`decoded` with a space in front for each leading marker of the id's piece that the decode dropped."""
        if self._marker is None:
            return decoded
        piece = self.tokenizer.id_to_token(token_id)
        if not piece or piece[0] != self._marker:
            return decoded
        markers = len(piece) - len(piece.lstrip(self._marker))
        missing = markers - (len(decoded) - len(decoded.lstrip(" ")))
        return " " * missing + decoded if missing > 0 else decoded

    def _completed(self, token_id: int, context: Sequence[int]) -> str:
        """What `token_id` adds after the shortest tail of `context` with which it ends no character unfinished
        (the context's own unfinished characters count as its text); "" if none does."""
        for size in range(1, min(len(context), CONTEXT_TOKENS) + 1):
            window = list(context[-size:])
            full = self.decode([*window, token_id])
            if full.endswith(REPLACEMENT):
                continue
            clean_end = len(window)
            for j in range(len(window) - 1, -1, -1):
                if not self.of(window[j]).endswith(REPLACEMENT):
                    break
                clean_end = j
            prefix = self.decode(window[:clean_end]) if clean_end else ""
            # a normalizing decode may change the prefix: what follows their common part
            return full[common_prefix_length(prefix, full) :]
        return ""
