"""vLLM's `spaces_between_special_tokens: false` as its fast detokenizer (Hugging Face `tokenizers`) applies it: with
special tokens kept in the text, an added token (special or not) that follows an added token gives its own
content instead of the text the stream gives for it. So a decoder that joins tokens with a separator (WordPiece:
"[CLS] [SEP]") puts none between two added tokens ("[CLS][SEP]"); byte-level and SentencePiece decoders already
give an added token's content, so for them the output does not change. The first output token is never joined to
the prompt's last one (vLLM starts each request as if no added token came before).

transformers' `decode(..., spaces_between_special_tokens=False)` ignores the option for these tokenizers; vLLM's
server is what a client of detok compares with, so this follows vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from detok_worker.stream.decode.base import DecodeStream
from detok_worker.tokenizer.protocol import Tokenizer, added_token_contents


class JoinedAddedTokens(DecodeStream):
    """A stream whose consecutive added tokens give their contents (see the module docstring). It offers no lookup
    table (lookup_tables: none), so only the requests that ask for it pay for the check."""

    __slots__ = ("_inner", "_added", "_after_added")

    @classmethod
    def open(cls, inner: DecodeStream, added: Mapping[int, str]) -> JoinedAddedTokens:
        stream = object.__new__(cls)
        stream.tokenizer = inner.tokenizer
        stream.skip_special_tokens = inner.skip_special_tokens
        stream._inner = inner
        stream._added = added
        stream._after_added = False
        return stream

    @property
    def fast_path(self) -> bool:  # type: ignore[override]
        return self._inner.fast_path

    def _joined(self, token_id: int, text: str | None) -> str | None:
        content = self._added.get(token_id)
        joined = content if content is not None and self._after_added else text
        self._after_added = content is not None
        return joined

    def step(self, token_id: int) -> str | None:
        return self._joined(token_id, self._inner.step(token_id))

    def step_batch(self, ids: Sequence[int]) -> list[str]:
        texts = self._inner.step_batch(ids)  # checks every id before decoding any
        return [self._joined(token_id, text) or "" for token_id, text in zip(ids, texts, strict=True)]

    def flush(self) -> str | None:
        return self._inner.flush()

    def pending_text(self) -> str:
        return self._inner.pending_text()

    @property
    def tokens(self) -> tuple[int, ...]:
        return self._inner.tokens


def join_added_tokens(stream: DecodeStream, tokenizer: Tokenizer) -> DecodeStream:
    """`stream` with vLLM's rule for spaces_between_special_tokens false (skip_special_tokens false): the stream
    itself when the tokenizer has no added tokens (vLLM: then the option changes nothing) or does not say."""
    added = added_token_contents(tokenizer)
    return JoinedAddedTokens.open(stream, added) if added else stream
