"""Mistral Tekken tokenizers (`tekken.json`) through mistral-common (extra: detok[mistral]).

Ids follow mistral-common: the first `num_special_tokens` ids are control tokens (`<unk>`, `<s>`, `</s>`,
`[INST]`, ...), then the tiktoken-style BPE. Encoding splits the text at control-token texts (so a rendered prompt
maps `[INST]` to its id, as Mistral's Hugging Face conversions do) and encodes the rest with mistral-common.
Decoding is mistral-common's (the tokenizer's own library is the reference): with skip_special_tokens=False it
is the KEEP policy, the concatenated token bytes decoded as UTF-8 with replacement; with skip_special_tokens=True
it is the IGNORE policy, which decodes each run of ordinary tokens between special tokens on its own, so a
dropped special token still ends the text before it: `[1227, 1129, 3, 1130]` (the bytes of "あ" split by `[INST]`)
decodes to two U+FFFD, not to "あ". The tokenizer and its byte table say so (`skipped_special_ends_text`): both
streaming paths stream exactly this decode.
Token strings use the GPT-2 byte-level alphabet, like the tiktoken backend; control tokens are their text.

Mistral's SentencePiece `.model` files need no adapter: the SentencePiece backend gives mistral-common's ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detok_worker.tokenizer.base import (
    ByteTableTokenizer,
    SpecialTextSplitter,
    char_spans_from_byte_lengths,
    import_optional,
)
from detok_worker.tokenizer.chat.source import ChatTemplates
from detok_worker.tokenizer.loading.side_files import build_special_tokens, read_side_config
from detok_worker.tokenizer.protocol import TokenizerLoadError

_NAMED = {"bos": "<s>", "eos": "</s>", "unk": "<unk>", "pad": "<pad>"}


class TekkenTokenizer(ByteTableTokenizer):
    """A mistral-common Tekkenizer behind the tokenizer protocol; see the module docstring."""

    skipped_special_ends_text = True

    def __init__(self, path: str | Path, *, chat_templates: ChatTemplates | None = None) -> None:
        tekken = import_optional("mistral_common.tokens.tokenizers.tekken", "mistral")
        base = import_optional("mistral_common.tokens.tokenizers.base", "mistral")
        try:
            self._tekken: Any = tekken.Tekkenizer.from_file(str(path))
        except Exception as exc:  # mistral-common raises assorted errors for a malformed file
            raise TokenizerLoadError(f"cannot load Tekken tokenizer {path}: {exc}") from exc
        model = self._tekken
        keep = base.SpecialTokenPolicy.KEEP
        n_special = model.num_special_tokens
        pieces: list[bytes | None] = [model.id_to_byte_piece(i, keep) for i in range(model.n_words)]
        special_text = {i: pieces[i].decode() for i in range(n_special)}
        self._splitter = SpecialTextSplitter({text: i for i, text in special_text.items()})
        named = {role: text for role, text in _NAMED.items() if text in special_text.values()}
        side = read_side_config(Path(path).parent)
        super().__init__(
            pieces=pieces,
            special_text=special_text,
            name=str(path),
            vocab_size=model.n_words,
            special_tokens=build_special_tokens(named, set(special_text.values())),
            special_token_ids=range(n_special),
            eos_token_ids={model.eos_id, *side.generation_eos_ids},
            chat_templates=chat_templates,
            add_bos_id=model.bos_id,
        )

    def encode_plain(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        byte_lengths: list[int] = []
        for _, item in self._splitter.split(text):
            pieces = [item] if isinstance(item, int) else self._tekken.encode(item, bos=False, eos=False)
            ids += pieces
            byte_lengths += [len(self._pieces[i]) for i in pieces]
        return ids, char_spans_from_byte_lengths(text, byte_lengths)
