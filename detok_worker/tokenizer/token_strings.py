"""The string one token id stands for in logprobs (`token`, `decoded_token`): vLLM's rule
(`convert_ids_list_to_tokens`), the tokenizer's decode of the id alone, special tokens kept, with the leading spaces
that decode strips from a piece that starts with a word-start marker (SentencePiece's "▁Hello" decodes alone to
"Hello"; its token string is " Hello", as OpenAI's tokens read). A tokenizer without such a marker (byte-level BPE,
tiktoken) keeps its decode as it is.
"""

from __future__ import annotations

from detok_worker.tokenizer.protocol import MarksWordStarts, Tokenizer, WrapsTokenizer


def word_start_marker(tokenizer: Tokenizer) -> str | None:
    """The marker character of the tokenizer's pieces (that of the tokenizer a wrapper wraps), or None."""
    while isinstance(tokenizer, WrapsTokenizer) and tokenizer.inner is not tokenizer:
        tokenizer = tokenizer.inner
    return tokenizer.word_start_marker() if isinstance(tokenizer, MarksWordStarts) else None


def token_string(tokenizer: Tokenizer, token_id: int, decoded: str, marker: str | None) -> str:
    """The token string of `token_id`, whose decode alone is `decoded`, for a tokenizer whose word-start marker is
    `marker` (word_start_marker, asked once): a space in front for each leading marker of its piece that the decode
    dropped."""
    if marker is None:
        return decoded
    piece = tokenizer.id_to_token(token_id)
    if not piece or piece[0] != marker:
        return decoded
    markers = len(piece) - len(piece.lstrip(marker))
    missing = markers - (len(decoded) - len(decoded.lstrip(" ")))
    return " " * missing + decoded if missing > 0 else decoded
