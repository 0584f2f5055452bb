"""Shared plumbing for the tokenizer backends.

`TokenizerBase` holds what every backend has in common: the vocabulary size, the special-token sets, id
validation, batch encoding and chat templates. A backend subclasses it and implements `encode_plain` (or `encode`),
`decode`, `token_to_id` and `id_to_token` (and overrides the rest where its library does better, as the Hugging Face one
does for batches and id checks); `ByteTableTokenizer` implements all but `encode` for a backend whose decode joins
per-token bytes. `char_spans_from_byte_lengths` turns per-token byte lengths into the character
offsets `Encoding` carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from itertools import groupby
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.chat.source import ChatTemplates, load_chat_template, missing_template_error
from detok_worker.tokenizer.chat.template import special_tokens_template_vars
from detok_worker.tokenizer.protocol import Encoding, SpecialTokens, TokenizerLoadError, check_token_ids
from detok_worker.tokenizer.token_bytes import TokenBytesTable


class TokenizerBase:
    """Common state and behaviour of a backend; see the module docstring. Chat templates (a ChatTemplates, or None)
    render as transformers' apply_chat_template does."""

    @property
    def chat_templates(self) -> ChatTemplates | None:
        return self._chat_templates

    def use_chat_templates(self, templates: ChatTemplates | None) -> None:
        self._chat_templates = templates

    def set_chat_template(self, template: str | Path | None) -> None:
        """Replace the chat template: a .jinja/.json path or an inline template (None removes it)."""
        self._chat_templates = load_chat_template(None, explicit=template) if template else None

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """`chat_template_name=` picks one of several named templates (else "tool_use" with tools, else "default")."""
        if self._chat_templates is None:
            raise missing_template_error(self.name)
        return self._chat_templates.render(
            messages,
            tools=tools,
            template_name=template_kwargs.pop("chat_template_name", None),
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            special_tokens=special_tokens_template_vars(self._special_tokens),
            **template_kwargs,
        )

    def __init__(
        self,
        *,
        name: str,
        vocab_size: int,
        special_tokens: SpecialTokens,
        special_token_ids: Iterable[int],
        eos_token_ids: Iterable[int],
        chat_templates: ChatTemplates | None = None,
        unknown_ids: Iterable[int] = (),
        add_bos_id: int | None = None,
        add_eos_id: int | None = None,
    ) -> None:
        """`unknown_ids`: ids in [0, vocab_size) that name no token; `add_bos_id`/`add_eos_id`: what
        add_special_tokens=True adds around `encode_plain`'s ids (None: nothing)."""
        self.name = name
        self._vocab_size = vocab_size
        self._special_tokens = special_tokens
        self._special_token_ids = frozenset(special_token_ids)
        self._eos_token_ids = frozenset(eos_token_ids)
        self._chat_templates = chat_templates
        self._unknown_ids = frozenset(unknown_ids)
        self._add_bos_id = add_bos_id
        self._add_eos_id = add_eos_id

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_tokens(self) -> SpecialTokens:
        return self._special_tokens

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_token_ids

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        """`encode_plain`; with add_special_tokens, the BOS/EOS to add on the empty span at their end of the text."""
        ids, offsets = self.encode_plain(text)
        if add_special_tokens:
            if self._add_bos_id is not None:
                ids.insert(0, self._add_bos_id)
                offsets.insert(0, (0, 0))
            if self._add_eos_id is not None:
                ids.append(self._add_eos_id)
                offsets.append((len(text), len(text)))
        return Encoding(ids=ids, offsets=offsets)

    def encode_ids(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encode(text, add_special_tokens).ids

    def encode_plain(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and character spans of `text`, nothing added."""
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[Encoding]:
        return [self.encode(text, add_special_tokens) for text in texts]

    def check_ids(self, ids: Iterable[int]) -> None:
        """Raise InvalidTokenIdError naming the first id that is not a token of this tokenizer."""
        check_token_ids(ids if isinstance(ids, (list, tuple)) else list(ids), self._vocab_size, self._unknown_ids)


class ByteTableTokenizer(TokenizerBase):
    """A backend whose decode joins per-token bytes, then UTF-8 with replacement (tiktoken, Tekken, the mock):
    decode, token strings and the fast path's byte table all come from `pieces` (None for an id naming no token).
    `special_text`: id -> text of the added/special tokens, which token strings spell as themselves; every other
    token is spelled in the GPT-2 byte-level alphabet. `ids_by_text` (default: `special_text` inverted) and
    `ids_by_bytes` (default: every other piece) are what token_to_id looks a token up in.
    `skipped_special_ends_text`: see TokenBytesTable."""

    skipped_special_ends_text = False

    def __init__(
        self,
        *,
        pieces: list[bytes | None],
        special_text: Mapping[int, str],
        ids_by_text: Mapping[str, int] | None = None,
        ids_by_bytes: Mapping[bytes, int] | None = None,
        **base: Any,
    ) -> None:
        self._pieces = pieces
        self._special_text = special_text
        self._ids_by_text = ids_by_text if ids_by_text is not None else {t: i for i, t in special_text.items()}
        if ids_by_bytes is None:
            ids_by_bytes = {p: i for i, p in enumerate(pieces) if p is not None and i not in special_text}
        self._ids_by_bytes = ids_by_bytes
        super().__init__(**base)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.check_ids(ids)
        pieces = self._pieces
        if not skip_special_tokens:
            return b"".join([pieces[i] for i in ids]).decode("utf-8", errors="replace")
        special = self._special_token_ids
        if not self.skipped_special_ends_text:
            return b"".join([pieces[i] for i in ids if i not in special]).decode("utf-8", errors="replace")
        runs = groupby(ids, key=special.__contains__)
        return "".join(
            b"".join([pieces[i] for i in run]).decode("utf-8", errors="replace")
            for is_special, run in runs
            if not is_special
        )

    def token_to_id(self, token: str) -> int | None:
        return id_of_token_string(token, self._ids_by_text, self._ids_by_bytes)

    def id_to_token(self, token_id: int) -> str | None:
        text = self._special_text.get(token_id)
        if text is not None:
            return text
        piece = self._pieces[token_id] if 0 <= token_id < len(self._pieces) else None
        return None if piece is None else bytes_to_token_string(piece)

    def token_bytes_table(self) -> TokenBytesTable:
        return TokenBytesTable(pieces=self._pieces, skipped_special_ends_text=self.skipped_special_ends_text)


def _utf8_length(ch: str) -> int:
    code = ord(ch)
    return 1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4


def char_spans_from_byte_lengths(text: str, byte_lengths: Sequence[int]) -> list[tuple[int, int]]:
    """Character span of each token, given the UTF-8 byte length of each token of `text`, in order.

    A token that covers only part of a character gets the span of that whole character, like the offsets of
    Hugging Face byte-level tokenizers. The byte lengths must add up to the UTF-8 length of `text`.
    """
    if text.isascii():
        spans = []
        position = 0
        for length in byte_lengths:
            spans.append((position, position + length))
            position += length
        return spans
    # char_of_byte[b] = index of the character that byte b belongs to
    char_of_byte: list[int] = []
    for index, ch in enumerate(text):
        char_of_byte.extend([index] * _utf8_length(ch))
    spans = []
    position = 0
    for length in byte_lengths:
        if length == 0:
            at = char_of_byte[position] if position < len(char_of_byte) else len(text)
            spans.append((at, at))
            continue
        spans.append((char_of_byte[position], char_of_byte[position + length - 1] + 1))
        position += length
    return spans


@cache
def byte_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-level alphabet: printable bytes map to themselves, the others to U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@cache
def unicode_to_byte() -> dict[str, int]:
    return {ch: b for b, ch in byte_to_unicode().items()}


def bytes_to_token_string(data: bytes) -> str:
    table = byte_to_unicode()
    return "".join(table[b] for b in data)


def token_string_to_bytes(token: str) -> bytes | None:
    table = unicode_to_byte()
    try:
        return bytes(table[ch] for ch in token)
    except KeyError:
        return None


def id_of_token_string(token: str, special_ids: Mapping[str, int], ids_by_bytes: Mapping[bytes, int]) -> int | None:
    """The id of a token as a byte-table backend's `id_to_token` writes it: a special token's text, else the
    GPT-2 alphabet string of its bytes."""
    if token in special_ids:
        return special_ids[token]
    data = token_string_to_bytes(token)
    return None if data is None else ids_by_bytes.get(data)


def import_optional(module: str, extra: str) -> Any:
    """Import an optional dependency, or raise TokenizerLoadError naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise TokenizerLoadError(f"this tokenizer needs the {module!r} package: pip install 'detok[{extra}]'") from exc


class SpecialTextSplitter:
    """Splits text at the texts of atomic tokens (special/added tokens), longest match first, as Hugging Face
    tokenizers do before running the model on the stretches in between."""

    def __init__(self, atomic_ids: dict[str, int]) -> None:
        self._ids = {text: token_id for text, token_id in atomic_ids.items() if text}
        texts = sorted(self._ids, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, texts))) if texts else None

    def split(self, text: str) -> Iterator[tuple[int, str | int]]:
        """(char offset, stretch of text) and (char offset, atomic token id) items, in order; no empty stretches."""
        position = 0
        if self._pattern is not None:
            for match in self._pattern.finditer(text):
                if match.start() > position:
                    yield position, text[position : match.start()]
                yield match.start(), self._ids[match.group()]
                position = match.end()
        if position < len(text):
            yield position, text[position:]
