"""A deterministic, dependency-free tokenizer for unit tests of code that only needs *a* tokenizer.

Vocabulary: ids 0-255 are the single bytes, then the given multi-byte `words` (matched greedily, longest first),
then the special tokens. Every character outside the words is split into its UTF-8 bytes, so multi-byte
characters span several tokens, as in real byte-level BPEs. Decoding concatenates token bytes (invalid UTF-8
becomes U+FFFD). Token strings use the GPT-2 byte-level alphabet, like the tiktoken backend.
"""

from __future__ import annotations

from collections.abc import Sequence

from detok_worker.tokenizer.base import ByteTableTokenizer, char_spans_from_byte_lengths
from detok_worker.tokenizer.chat.source import load_chat_template
from detok_worker.tokenizer.loading.side_files import build_special_tokens

DEFAULT_WORDS = ("hello", " world", " the", "ing", " and", "你好", "🙂")
DEFAULT_SPECIALS = ("<bos>", "<eos>", "<pad>")
MOCK_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message.role }}|>{{ message.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


class MockTokenizer(ByteTableTokenizer):
    """See the module docstring. `special_tokens[0]` is BOS, `[1]` EOS, `[2]` PAD when present."""

    def __init__(
        self,
        words: Sequence[str] = DEFAULT_WORDS,
        specials: Sequence[str] = DEFAULT_SPECIALS,
        *,
        name: str = "mock",
        chat_template: str | None = MOCK_CHAT_TEMPLATE,
    ) -> None:
        pieces: list[bytes | None] = [bytes([b]) for b in range(256)]
        pieces += [w.encode() for w in words]
        self._words = sorted(((w, 256 + i) for i, w in enumerate(words)), key=lambda item: -len(item[0]))
        first_special = len(pieces)
        self._specials = {text: first_special + i for i, text in enumerate(specials)}
        pieces += [s.encode() for s in specials]
        named = dict(zip(("bos", "eos", "pad"), specials, strict=False))
        super().__init__(
            pieces=pieces,
            special_text={token_id: text for text, token_id in self._specials.items()},
            name=name,
            vocab_size=len(pieces),
            special_tokens=build_special_tokens(named, set(specials)),
            special_token_ids=self._specials.values(),
            eos_token_ids=[self._specials[named["eos"]]] if "eos" in named else [],
            chat_templates=load_chat_template(None, chat_template) if chat_template else None,
            add_bos_id=self._specials.get(named.get("bos", "")),
        )

    def _match_at(self, text: str, position: int) -> tuple[list[int], int]:
        for special, token_id in self._specials.items():
            if text.startswith(special, position):
                return [token_id], len(special)
        for word, token_id in self._words:
            if text.startswith(word, position):
                return [token_id], len(word)
        return list(text[position].encode()), 1

    def encode_plain(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        position = 0
        while position < len(text):
            matched, length = self._match_at(text, position)
            ids += matched
            position += length
        return ids, char_spans_from_byte_lengths(text, [len(self._pieces[i]) for i in ids])
