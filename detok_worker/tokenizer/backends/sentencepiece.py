"""SentencePiece backend: a `.model` file through the `sentencepiece` package (extra: detok[sentencepiece]).

Encoding follows SentencePiece itself (as mistral-common and Llama's reference code use it): the text is split
at special-token texts (control pieces such as `<s>` or `[INST]`, the unknown piece, and added tokens from
tokenizer_config.json), each stretch is encoded with the model (so each gets its dummy-prefix space), and the
special ids are put in between. Decoding is SentencePiece's own decode of each stretch between special tokens,
so it follows the sentencepiece library, not Hugging Face tokenizers' conversion of the same model, where they
differ: byte pieces (`<0xNN>`) become their longest valid UTF-8 text and each byte that cannot be part of a
character becomes one U+FFFD (Hugging Face turns a whole run of byte pieces that is not valid UTF-8 into one
U+FFFD per byte), and only the dummy-prefix space of the first piece is removed, so a leading `<0x20>` byte piece
stays a space (Hugging Face's Strip decoder removes it too). Special tokens appear as their text unless skipped
(SentencePiece alone would drop control tokens), and a stretch after one keeps its leading space (SentencePiece
alone would strip it). tests/unit/tokenizer/test_backends_sentencepiece_decode.py pins this against the library.

Named special tokens and BOS/EOS policy come from tokenizer_config.json / special_tokens_map.json when they sit
beside the model, else from the model (bos/eos/unk/pad pieces; BOS is added by add_special_tokens=True unless
the config says add_bos_token: false). EOS ids also include generation_config.json's.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.base import SpecialTextSplitter, TokenizerBase, import_optional
from detok_worker.tokenizer.chat.source import ChatTemplates
from detok_worker.tokenizer.loading.side_files import SideConfig, build_special_tokens, read_side_config
from detok_worker.tokenizer.protocol import TokenizerLoadError

SPACE = "▁"


def model_proto_class(extra: str = "sentencepiece") -> Any:
    """SentencePiece's own generated `ModelProto` message class (it needs `protobuf`); TokenizerLoadError naming
    the extra that installs both when either is missing or protobuf is older than SentencePiece's generated code."""
    import_optional("sentencepiece", extra)
    import_optional("google.protobuf", extra)
    try:
        return importlib.import_module("sentencepiece.sentencepiece_model_pb2").ModelProto
    except Exception as exc:  # protobuf's VersionError is not an ImportError
        raise TokenizerLoadError(
            f"cannot load SentencePiece's ModelProto ({exc}): pip install -U 'detok[{extra}]'"
        ) from exc


def without_dummy_prefix(model_proto: bytes) -> bytes:
    """The same serialized ModelProto with add_dummy_prefix=false."""
    model = model_proto_class().FromString(model_proto)
    model.normalizer_spec.add_dummy_prefix = False
    return model.SerializeToString()


def _fill_byte_piece_spans(offsets: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """SentencePiece gives byte-fallback pieces of one character empty spans except the last; give each the
    character's span, as byte-level tokenizers do."""
    filled = list(offsets)
    for index in range(len(filled) - 2, -1, -1):
        start, end = filled[index]
        following = filled[index + 1]
        if start == end and following[0] == start and following[1] > start:
            filled[index] = following
    return filled


class SentencePieceTokenizer(TokenizerBase):
    """A SentencePiece model plus the side configuration; see the module docstring."""

    def __init__(
        self,
        model_file: str | Path | None = None,
        *,
        model_proto: bytes | None = None,
        name: str | None = None,
        side: SideConfig | None = None,
        chat_templates: ChatTemplates | None = None,
    ) -> None:
        """From a `.model` file, or from a serialized ModelProto (`model_proto`, e.g. rebuilt from GGUF)."""
        spm = import_optional("sentencepiece", "sentencepiece")
        side = side or SideConfig()
        name = name or str(model_file)
        try:
            if model_proto is not None:
                self._sp: Any = spm.SentencePieceProcessor(model_proto=model_proto)
            else:
                self._sp = spm.SentencePieceProcessor(model_file=str(model_file))
        except (OSError, RuntimeError) as exc:
            raise TokenizerLoadError(f"cannot load SentencePiece model {name}: {exc}") from exc
        sp = self._sp
        # Text that follows a special token gets no dummy-prefix space (Hugging Face's prepend_scheme "first",
        # and what mistral-common produces for "[INST] hi"), so encode and decode round-trip.
        self._sp_continuation: Any = spm.SentencePieceProcessor(
            model_proto=without_dummy_prefix(sp.serialized_model_proto())
        )
        n_pieces = sp.vocab_size()
        # Atomic ids: decoded as their text, matched as whole texts when encoding.
        self._atomic_text: dict[int, str] = {
            i: sp.id_to_piece(i) for i in range(n_pieces) if sp.is_control(i) or sp.is_unknown(i)
        }
        special_ids = set(self._atomic_text)
        for token_id, token in side.added_tokens.items():
            if token_id >= n_pieces or token_id in self._atomic_text:
                self._atomic_text[token_id] = token.content
                if token.special:
                    special_ids.add(token_id)
        self._atomic_ids = {text: token_id for token_id, text in self._atomic_text.items()}
        self._splitter = SpecialTextSplitter(self._atomic_ids)
        named = self._named_tokens(side)
        eos_ids = set(side.generation_eos_ids)
        if "eos" in named and named["eos"] in self._atomic_ids:
            eos_ids.add(self._atomic_ids[named["eos"]])
        self._strips_leading_space = self._model_strips_leading_space()
        vocab_size = max(n_pieces, max(self._atomic_text, default=-1) + 1)
        super().__init__(
            name=name,
            vocab_size=vocab_size,
            special_tokens=build_special_tokens(named, {self._atomic_text[i] for i in special_ids}),
            special_token_ids=special_ids,
            eos_token_ids=eos_ids,
            chat_templates=chat_templates,
            unknown_ids=set(range(n_pieces, vocab_size)) - self._atomic_text.keys(),
            add_bos_id=self._atomic_ids.get(named.get("bos", "")) if side.add_bos_token is not False else None,
            add_eos_id=self._atomic_ids.get(named.get("eos", "")) if side.add_eos_token else None,
        )

    def _named_tokens(self, side: SideConfig) -> dict[str, str]:
        if side.named:
            return dict(side.named)
        sp = self._sp
        model_ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(), "pad": sp.pad_id()}
        return {role: sp.id_to_piece(i) for role, i in model_ids.items() if 0 <= i < sp.vocab_size()}

    def _model_strips_leading_space(self) -> bool:
        """Whether SentencePiece drops the leading space of the first decoded piece (it does when the model
        adds a dummy prefix or removes extra whitespace)."""
        sp = self._sp
        for token_id in range(sp.vocab_size()):
            piece = sp.id_to_piece(token_id)
            if piece.startswith(SPACE) and len(piece) > 1 and token_id not in self._atomic_text:
                return sp.decode([token_id]) == piece[1:].replace(SPACE, " ")
        return False

    def encode_plain(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        for position, item in self._splitter.split(text):
            if isinstance(item, int):
                ids.append(item)
                offsets.append((position, position + len(self._atomic_text[item])))
                continue
            processor = self._sp_continuation if ids else self._sp
            mapping = processor.encode_as_offset_mapping(item)
            ids.extend(mapping["ids"])
            offsets.extend((position + s, position + e) for s, e in _fill_byte_piece_spans(mapping["offsets"]))
        return ids, offsets

    def _decode_run(self, run: list[int], after_text: bool) -> str:
        text = self._sp.decode(run)
        if after_text and self._strips_leading_space and self._sp.id_to_piece(run[0]).startswith(SPACE):
            return " " + text
        return text

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        self.check_ids(ids)
        if skip_special_tokens:
            ids = [token_id for token_id in ids if token_id not in self._special_token_ids]
        atomic = self._atomic_text
        if not any(i in atomic for i in ids):
            return self._sp.decode(list(ids))
        parts: list[str] = []
        for is_atomic, run in groupby(ids, key=atomic.__contains__):
            if is_atomic:
                parts += [atomic[token_id] for token_id in run]
            else:
                parts.append(self._decode_run(list(run), bool(parts)))
        return "".join(parts)

    def token_to_id(self, token: str) -> int | None:
        if token in self._atomic_ids:
            return self._atomic_ids[token]
        token_id = self._sp.piece_to_id(token)
        return token_id if self._sp.id_to_piece(token_id) == token else None

    def id_to_token(self, token_id: int) -> str | None:
        if token_id in self._atomic_text:
            return self._atomic_text[token_id]
        if 0 <= token_id < self._sp.vocab_size():
            return self._sp.id_to_piece(token_id)
        return None


def load_sentencepiece(
    model_file: str | Path, *, chat_templates: ChatTemplates | None = None
) -> SentencePieceTokenizer:
    """A `.model` file, with the side files of its directory."""
    side = read_side_config(Path(model_file).parent)
    return SentencePieceTokenizer(model_file, side=side, chat_templates=chat_templates)
