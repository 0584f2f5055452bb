"""Case generators: (prompt ids, generated ids, skip_special_tokens) triples for one family's tokenizer."""

from __future__ import annotations

import random
from collections.abc import Iterator

from helpers.texts import load_texts

from differential.check import cut_points_inside_characters
from differential.oracle import ByteOracle

Case = tuple[list[int], list[int], bool]

# Byte prefixes the reference decoders resolve at once (surrogate prefixes, overlongs, beyond U+10FFFF, bytes that
# start nothing) and ones still unfinished, each followed by what may come next.
BYTE_PREFIXES = [b"\xed\xa0", b"\xed\xbf", b"\xe0\x80", b"\xe0\x9f", b"\xf0\x80", b"\xf0\x8f", b"\xf4\x90", b"\xc0"]
BYTE_PREFIXES += [b"\xc1", b"\xf5", b"\xff", b"\xe1\x80", b"\xf0\x9f\x98", b"\xed\x9f", b"\xf4\x8f\xbf", b"\xc3"]
BYTE_FOLLOWERS = [b"", b"\x80", b"\xbf", b"A", b"\xf0\x9f\x98\x80", b"\xa9"]


def byte_ids(model: ByteOracle) -> dict[int, int]:
    """byte -> an id standing for exactly that byte (byte tokens, or single-byte byte-level tokens)."""
    if model.byte_fallback:
        return dict(model.id_of_byte)
    found: dict[int, int] = {}
    for token_id in range(model.vocab_size):
        data = model._data[token_id]
        if len(data) == 1 and token_id not in model.special:
            found.setdefault(data[0], token_id)
    return found


def canonical(tokenizer, limit: int) -> Iterator[Case]:
    for number, text in enumerate(load_texts().values()):
        ids = tokenizer.encode(text).ids[:limit]
        yield [], ids, number % 2 == 1


def random_ids(tokenizer, model: ByteOracle, seed: int, count: int) -> Iterator[Case]:
    rng = random.Random(seed)
    partial = model.partial_ids or list(range(model.vocab_size))
    special = sorted(tokenizer.special_token_ids) or [0]
    pools = [partial, model.byte_token_ids or partial, special, range(tokenizer.vocab_size)]
    weights = [4, 3, 1, 2]
    for _ in range(count):
        ids = [rng.choice(rng.choices(pools, weights)[0]) for _ in range(rng.randrange(2, 30))]
        ids = [i for i in ids if tokenizer.id_to_token(i) is not None]
        cut = rng.randrange(0, len(ids) + 1)
        yield ids[:cut], ids[cut:], rng.random() < 0.5


def byte_prefixes(tokenizer, model: ByteOracle) -> Iterator[Case]:
    by_byte = byte_ids(model)
    text_ids = tokenizer.encode("ok é").ids
    for prefix in BYTE_PREFIXES:
        for follower in BYTE_FOLLOWERS:
            data = prefix + follower
            if all(b in by_byte for b in data):
                ids = [by_byte[b] for b in data]
                yield [], [*ids, *text_ids], False
                yield ids[:1], [*ids[1:], *text_ids], False  # the prompt ends inside the prefix


def special_runs(tokenizer, model: ByteOracle, lengths: list[int]) -> Iterator[Case]:
    """A prompt ending inside a character, then n skipped special tokens, then the rest of the character."""
    special = sorted(tokenizer.special_token_ids)
    ids = tokenizer.encode("€ 😀 ok").ids
    cuts = cut_points_inside_characters("", ids, model)
    for n in lengths:
        for cut in cuts[:2]:
            yield [*ids[:cut], *[special[n % len(special)]] * n], ids[cut:], True


def prompt_cuts(tokenizer, model: ByteOracle, limit: int) -> Iterator[Case]:
    """Prompts cut at every point inside a character of the emoji and CJK texts."""
    texts = load_texts()
    for name in ("emoji", "cjk-gb18030"):
        ids = tokenizer.encode(texts[name][:300]).ids
        for cut in cut_points_inside_characters("", ids, model)[:limit]:
            yield ids[:cut], ids[cut : cut + 12], False


def long_invalid_runs(tokenizer, model: ByteOracle, lengths: list[int]) -> Iterator[Case]:
    """n invalid bytes, then a 4-byte character spelled in bytes, then text (the generic path's old 128-id cap)."""
    by_byte = byte_ids(model)
    if 0x80 not in by_byte:
        return
    text_ids = tokenizer.encode(" a").ids
    emoji = [by_byte[b] for b in "😀".encode()]
    for n in lengths:
        yield [], [by_byte[0x80]] * n + emoji + text_ids, False
