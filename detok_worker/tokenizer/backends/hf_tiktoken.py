"""Prompt encoding through tiktoken for the byte-level BPE tokenizer.json files it encodes the same way.

`tokenizers` spends most of an encode in its regex engine and in building its Encoding; tiktoken's BPE over the
same ranks with the same split pattern gives the same ids in a fraction of the time, and the prompt side of every
request is an encode. The shape it takes (`TiktokenEncoder.build` checks it, and logs why not otherwise):
- the model is BPE over the ByteLevel alphabet whose merges make every token in the order of their ids
  (vocabularies that come from tiktoken: Qwen, Llama-3, GPT-4o, gpt-oss), no dropout, byte fallback or affixes;
- the pre-tokenizer is one regex Split that keeps its matches, then ByteLevel without its own regex or prefix space;
- no normalizer, or NFC (a text whose NFC form composes or decomposes characters goes through the library for
  its ids and offsets, `encode`; its ids alone, `encode_ids`, come from here);
- added tokens without lstrip, rstrip or single_word: the text splits at them leftmost-longest, as the library's
  added vocabulary does, and each stands for its own id;
- no truncation or padding; nothing added around the ids and no offset trimming (no post-processor, or ByteLevel
  without trim_offsets): else only add_special_tokens=False encodes here.
Offsets are the library's: a token's span covers every character one of its bytes belongs to. A probe text of many
scripts is encoded both ways at build; any difference turns the path off (the reason is logged).
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Iterator
from itertools import accumulate
from operator import sub
from typing import Any

import tiktoken
from tokenizers import Tokenizer as RustTokenizer

from detok_worker.tokenizer.base import unicode_to_byte
from detok_worker.tokenizer.protocol import Encoding

log = logging.getLogger(__name__)

_PROBE = (
    "Hello, world! It's 2026; they'll say \"ok\" — naïve café 日本語のテキスト 中文 한국어 Ελληνικά русский "
    "עברית العربية हिन्दी 😀👩🏽‍💻🇫🇷 \t\n\n  x  \r\n  123456 3.14159 a\u00a0b\u3000c ＡＢＣ ﬁ "
    "def f(x):\n    return x**2  # comment\n\n\n{\"k\": [1, 2]} <|x|> ''' ``` ---- ...."
)
# characters NFC composes (a combining acute, a diaeresis, Hangul jamo) or splits in two (U+0958, U+0344): ids only
_COMPOSING_PROBE = "cafe\u0301 na\u0308ive \u1100\u1161\u11a8 \u0958 x\u0344 <|x|>e\u0301"


class TiktokenEncoder:
    """Encodes as the tokenizer.json it was built from does (see the module docstring for the shape it needs)."""

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        added_ids: dict[str, int],
        token_bytes: list[bytes],
        *,
        nfc: bool,
        normalized_added: bool,
        adds_nothing: bool,
    ) -> None:
        self._encoding = encoding
        self._added_ids = added_ids
        # longest first: at one position the alternation takes the longest token (leftmost-longest overall)
        alternatives = sorted(added_ids, key=len, reverse=True)
        self._added = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        # per id: the characters its bytes begin (UTF-8 lead bytes), and 1 when its first byte continues one
        self._lead_bytes = [sum(1 for b in piece if not 0x80 <= b < 0xC0) for piece in token_bytes]
        self._starts_inside = [int(bool(piece) and 0x80 <= piece[0] < 0xC0) for piece in token_bytes]
        self._nfc = nfc
        # an added token the library matches in the normalized text: a text NFC changes goes to the library
        self._normalized_added = normalized_added
        self.adds_nothing = adds_nothing  # add_special_tokens=True adds no ids and trims no offsets

    @classmethod
    def build(cls, tokenizer: RustTokenizer) -> TiktokenEncoder | None:
        """The encoder of `tokenizer`, or None (with the reason in the log) when it is not of the shape above or
        the probe text encodes differently."""
        spec = json.loads(tokenizer.to_str())
        reason = _unsupported(spec)
        if getattr(tokenizer, "encode_special_tokens", False):
            reason = "it encodes special tokens as text"
        if reason is None:
            encoder = cls._from_spec(spec)
            if encoder is None:
                reason = "its merges do not make every token in the order of their ids"
            else:
                expected = tokenizer.encode(_PROBE, add_special_tokens=False)
                got = encoder.encode(_PROBE)
                composing = encoder.encode_ids(_COMPOSING_PROBE)
                if got is None or (got.ids, got.offsets) != (expected.ids, expected.offsets):
                    reason = "tiktoken encodes the probe text differently"
                elif composing not in (None, tokenizer.encode(_COMPOSING_PROBE, add_special_tokens=False).ids):
                    reason = "tiktoken encodes the NFC probe text differently"
                else:
                    return encoder
        log.info("prompts are encoded by tokenizers, not tiktoken: %s", reason)
        return None

    @classmethod
    def _from_spec(cls, spec: dict[str, Any]) -> TiktokenEncoder | None:
        alphabet = unicode_to_byte()
        model = spec["model"]
        vocab: dict[str, int] = model["vocab"]
        made_ids = _merges_follow_ids(model.get("merges") or [], vocab)
        if made_ids is None:
            return None
        try:
            ranks = {bytes(alphabet[ch] for ch in token): token_id for token, token_id in vocab.items()}
        except KeyError:  # a model token outside the ByteLevel alphabet
            return None
        if any(len(piece) > 1 and token_id not in made_ids for piece, token_id in ranks.items()):
            return None  # a token no merge makes: tiktoken would make it
        if sum(len(piece) == 1 for piece in ranks) != 256:
            return None  # tiktoken needs a token for every byte
        added = {token["content"]: token["id"] for token in spec.get("added_tokens", [])}
        size = max(*vocab.values(), *added.values(), -1) + 1
        token_bytes = [b""] * size
        for piece, token_id in ranks.items():
            token_bytes[token_id] = piece
        pattern = spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
        encoding = tiktoken.Encoding("tokenizer.json", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
        normalizer = spec.get("normalizer")
        post = spec.get("post_processor")
        adds_nothing = post is None or (post.get("type") == "ByteLevel" and not post.get("trim_offsets"))
        normalized_added = any(token.get("normalized") for token in spec.get("added_tokens", []))
        return cls(
            encoding,
            added,
            token_bytes,
            nfc=normalizer is not None,
            normalized_added=normalized_added,
            adds_nothing=adds_nothing,
        )

    def encode(self, text: str) -> Encoding | None:
        """ids and offsets of `text` without added special tokens, or None: the library must encode it."""
        normalized = text
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            normalized = _nfc_in_place(text)
            if normalized is None or self._normalized_added:
                return None
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        for start, end, added in self._split(text):
            if added is None:
                self._encode_piece(normalized[start:end], start, ids, offsets)
            else:
                ids.append(added)
                offsets.append((start, end))
        return Encoding(ids=ids, offsets=offsets)

    def encode_ids(self, text: str) -> list[int] | None:
        """`encode`'s ids, also of a text whose NFC form composes or decomposes characters: each piece between
        added tokens is normalized on its own, as the library normalizes the pieces its added vocabulary splits off.
        None: the library must encode it."""
        normalize = self._nfc and not unicodedata.is_normalized("NFC", text)
        if normalize and self._normalized_added:
            return None
        encode = self._encoding.encode_ordinary
        ids: list[int] = []
        for start, end, added in self._split(text):
            if added is None:
                piece = text[start:end]
                ids += encode(unicodedata.normalize("NFC", piece) if normalize else piece)
            else:
                ids.append(added)
        return ids

    def _split(self, text: str) -> Iterator[tuple[int, int, int | None]]:
        """`text` in order as (start, end, id): an added token and its id, or a piece between them (None) to
        encode. Added tokens are matched in the text as it came, as the library matches unnormalized tokens."""
        at = 0
        if self._added is not None:
            for match in self._added.finditer(text):
                if match.start() > at:
                    yield at, match.start(), None
                yield match.start(), match.end(), self._added_ids[match.group()]
                at = match.end()
        if at < len(text):
            yield at, len(text), None

    def _encode_piece(self, piece: str, base: int, ids: list[int], offsets: list[tuple[int, int]]) -> None:
        piece_ids = self._encoding.encode_ordinary(piece)
        ids.extend(piece_ids)
        # characters begun before each token boundary: a token ends after the character of its last byte, and
        # starts at the character of its first byte (the one before, when that byte continues a character); all
        # C loops, no Python per token
        bounds = list(accumulate(map(self._lead_bytes.__getitem__, piece_ids), initial=base))
        starts = map(sub, bounds[:-1], map(self._starts_inside.__getitem__, piece_ids))
        offsets.extend(zip(starts, bounds[1:], strict=True))


def _nfc_in_place(text: str) -> str | None:
    """The NFC form of `text` when it changes characters one for one (a compatibility ideograph, a Kelvin sign):
    each character then keeps its offset. None when it composes or decomposes some (the library aligns those)."""
    normalized = unicodedata.normalize("NFC", text)
    if len(normalized) != len(text):
        return None
    for before, after in zip(text, normalized, strict=True):
        if before != after and unicodedata.normalize("NFC", before) != after:
            return None
    return normalized


def _unsupported(spec: dict[str, Any]) -> str | None:
    """Why tiktoken cannot encode as this tokenizer.json does, or None."""
    if spec.get("truncation") or spec.get("padding"):
        return "it truncates or pads"
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or model.get("byte_fallback"):
        return "its model is not a plain BPE"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "its BPE has subword affixes"
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return f"its normalizer is {normalizer.get('type')}"
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2 or [step.get("type") for step in steps] != ["Split", "ByteLevel"]:
        return "its pre-tokenizer is not one regex Split then ByteLevel"
    split, byte_level = steps
    # tiktoken keeps the regex's matches: an isolating Split (the text between matches is a piece too: the probe
    # finds a pattern that leaves some) or one that removes what does not match
    keeps_matches = (split.get("behavior"), bool(split.get("invert"))) in (("Isolated", False), ("Removed", True))
    if "Regex" not in split.get("pattern", {}) or not keeps_matches:
        return "its Split does not keep the regex's matches"
    if byte_level.get("use_regex") or byte_level.get("add_prefix_space"):
        return "its ByteLevel step splits or adds a space of its own"
    for token in spec.get("added_tokens", []):
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            return f"added token {token.get('content')!r} strips or matches single words"
    return None


def _merges_follow_ids(merges: list[Any], vocab: dict[str, int]) -> set[int] | None:
    """The ids the merges make, when each makes a token of the vocabulary and their ids never fall in merge order
    (tiktoken's rule, merge the pair whose result has the lowest id, is then the library's, merge the pair listed
    first); else None."""
    made_ids: set[int] = set()
    previous = -1
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        made = vocab.get(left + right)
        if made is None or made < previous:
            return None
        made_ids.add(made)
        previous = made
    return made_ids
