"""The tokenizer families the harness runs, each with an oracle built from an independent source of token bytes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mistral_common
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer

from detok_worker.tokenizer import create_tokenizer
from differential.oracle import PER_BYTE, STRIP_FIRST_PIECE, ByteOracle

MISTRAL_DATA = Path(mistral_common.__file__).parent / "data"
SENTENCEPIECE_MODELS = {
    "sentencepiece-v1": "tokenizer.model.v1",
    "sentencepiece-v7": "mistral_instruct_tokenizer_241114.model.v7",
}


def sentencepiece_oracle(tokenizer) -> ByteOracle:
    """From SentencePiece's own pieces: byte pieces are bytes, control/unknown pieces their text, others text with
    "▁" -> " "; a run of byte pieces is decoded character by character (one U+FFFD per invalid byte)."""
    processor = tokenizer._sp
    pieces: list[bytes] = []
    byte_ids = set()
    for token_id in range(tokenizer.vocab_size):
        if token_id >= processor.vocab_size():
            pieces.append(tokenizer.id_to_token(token_id).encode())
        elif processor.is_byte(token_id):
            pieces.append(bytes([int(processor.id_to_piece(token_id)[3:5], 16)]))
            byte_ids.add(token_id)
        elif processor.is_control(token_id) or processor.is_unknown(token_id):
            pieces.append(processor.id_to_piece(token_id).encode())
        else:
            pieces.append(processor.id_to_piece(token_id).replace("\u2581", " ").encode())
    return ByteOracle.from_pieces(
        pieces, tokenizer.special_token_ids, byte_ids=frozenset(byte_ids), semantics=PER_BYTE, strip=STRIP_FIRST_PIECE
    )


@dataclass(frozen=True)
class Family:
    name: str
    load: Callable[[], object]
    build_oracle: Callable[[object], ByteOracle]


def _families() -> dict[str, Family]:
    families = {
        name: Family(name, lambda name=name: load_fixture_tokenizer(name), ByteOracle)
        for name in FIXTURE_TOKENIZER_DIRS
    }
    for name, file in SENTENCEPIECE_MODELS.items():
        families[name] = Family(name, lambda file=file: create_tokenizer(MISTRAL_DATA / file), sentencepiece_oracle)
    return families


FAMILIES = _families()


@cache
def loaded(name: str) -> tuple[object, ByteOracle]:
    """(tokenizer, oracle) of a family, built once per session."""
    family = FAMILIES[name]
    tokenizer = family.load()
    return tokenizer, family.build_oracle(tokenizer)
