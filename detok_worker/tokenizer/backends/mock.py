"""A deterministic, dependency-free tokenizer for unit tests of code that only needs *a* tokenizer.

Vocabulary: ids 0-255 are the single bytes, then the given multi-byte `words` (matched greedily, longest first),
then the special tokens. Every character outside the words is split into its UTF-8 bytes, so multi-byte
characters span several tokens, as in real byte-level BPEs. Decoding concatenates token bytes (invalid UTF-8
becomes U+FFFD). Token strings use the GPT-2 byte-level alphabet, like the tiktoken backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok_worker.tokenizer.base import (
    TokenizerBase,
    bytes_to_token_string,
    char_spans_from_byte_lengths,
    id_of_token_string,
)
from detok_worker.tokenizer.chat.source import load_chat_template
from detok_worker.tokenizer.loading.side_files import build_special_tokens
from detok_worker.tokenizer.protocol import Encoding
from detok_worker.tokenizer.token_bytes import TokenBytesTable

DEFAULT_WORDS = ("hello", " world", " the", "ing", " and", "你好", "🙂")
DEFAULT_SPECIALS = ("<bos>", "<eos>", "<pad>")
MOCK_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message.role }}|>{{ message.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class MockTokenizer(TokenizerBase):
    """See the module docstring. `special_tokens[0]` is BOS, `[1]` EOS, `[2]` PAD when present."""

    def __init__(
        self,
        words: Sequence[str] = DEFAULT_WORDS,
        specials: Sequence[str] = DEFAULT_SPECIALS,
        *,
        name: str = "mock",
        chat_template: str | None = MOCK_CHAT_TEMPLATE,
    ) -> None:
        self._bytes: list[bytes] = [bytes([b]) for b in range(256)]
        self._bytes += [w.encode() for w in words]
        self._words = sorted(((w, 256 + i) for i, w in enumerate(words)), key=lambda item: -len(item[0]))
        first_special = len(self._bytes)
        self._specials = {text: first_special + i for i, text in enumerate(specials)}
        self._bytes += [s.encode() for s in specials]
        self._ids_by_bytes = {data: token_id for token_id, data in enumerate(self._bytes[:first_special])}
        named = dict(zip(("bos", "eos", "pad"), specials, strict=False))
        self._bos_id = self._specials.get(named.get("bos", ""))
        super().__init__(
            name=name,
            vocab_size=len(self._bytes),
            special_tokens=build_special_tokens(named, set(specials)),
            special_token_ids=self._specials.values(),
            eos_token_ids=[self._specials[named["eos"]]] if "eos" in named else [],
            chat_templates=load_chat_template(None, chat_template) if chat_template else None,
        )

    def _match_at(self, text: str, position: int) -> tuple[list[int], int]:
        for special, token_id in self._specials.items():
            if text.startswith(special, position):
                return [token_id], len(special)
        for word, token_id in self._words:
            if text.startswith(word, position):
                return [token_id], len(word)
        return list(text[position].encode()), 1

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        ids: list[int] = []
        position = 0
        while position < len(text):
            matched, length = self._match_at(text, position)
            ids += matched
            position += length
        offsets = char_spans_from_byte_lengths(text, [len(self._bytes[i]) for i in ids])
        if add_special_tokens and self._bos_id is not None:
            ids.insert(0, self._bos_id)
            offsets.insert(0, (0, 0))
        return Encoding(ids=ids, offsets=offsets)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.check_ids(ids)
        kept = self.without_special(ids) if skip_special_tokens else ids
        return b"".join(self._bytes[i] for i in kept).decode("utf-8", errors="replace")

    def token_bytes_table(self) -> TokenBytesTable:
        return TokenBytesTable(pieces=list(self._bytes))

    def token_to_id(self, token: str) -> int | None:
        return id_of_token_string(token, self._specials, self._ids_by_bytes)

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self.vocab_size:
            return None
        if token_id in self.special_token_ids:
            return self._bytes[token_id].decode()
        return bytes_to_token_string(self._bytes[token_id])
