"""Where the L1 prefix cache may split a prompt: right after a special token (`BoundaryFinder`, the encodes
around a boundary), decided per tokenizer by test encodes (`plan_prefix_split`), the plan kept on disk (`read_plan`).

Nothing is assumed from the tokenizer's type or config: every special token is tried as a boundary in a battery
of contexts (whitespace, newlines, CJK, emoji, combining marks, back-to-back tokens, start and end of text), for
both add_special_tokens values, through the very operations the cache performs on a hit (`encode_after`) and on
an insert (`locate_boundaries` + slicing). A token that fails anywhere is not used as a boundary; if the
tokenizer's add_special_tokens=True output is not a fixed lead/trail around its add_special_tokens=False output,
or a mixed multi-token probe fails, L1 is off for that add_special_tokens value, and the reason says why.

The plan on disk, like the fast path's tables: a front that starts with a tokenizer seen before reads the plan
instead of test-encoding again. Where: the detok cache directory (`cache_root()`), folder `split-plan/`, one JSON
file per key. The key covers what the plan is a function of: the tokenizer's `content_fingerprint()` (a tokenizer
without one is never cached), its class, vocabulary size, special tokens and special ids (tokenizer_config.json
names them, and they choose the probes), the file format, and a hash of this module's code. A file that is
missing, unreadable or written for another key is ignored and written again; any file may be deleted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.loading.load_cache import content_key, read_json_entry, write_json_entry
from detok_worker.tokenizer.protocol import Encoding, Tokenizer, TokenizerError

Offsets = list[tuple[int, int]]


# (start, end, token id) of a special token found in the text, in text order
Boundary = tuple[int, int, int]


# A text with more special tokens than this caches only its last ones (bounds work and entries per request).
MAX_BOUNDARIES_PER_TEXT = 512


class BoundaryFinder:
    """Finds special tokens in text the way the tokenizer's added-token matcher does: leftmost, then longest."""

    def __init__(self, token_ids: Mapping[str, int]) -> None:
        if not token_ids:
            raise ValueError("BoundaryFinder needs at least one token")
        self.token_ids = dict(token_ids)
        self._pattern = re.compile(_trie_pattern(self.token_ids))

    def find(self, text: str) -> list[Boundary]:
        token_ids = self.token_ids
        return [(match.start(), match.end(), token_ids[match.group()]) for match in self._pattern.finditer(text)]


def _trie_pattern(tokens: Iterable[str]) -> str:
    """A regex matching any of `tokens`, shaped as their trie: at a position it follows the one branch the next
    character allows and prefers going deeper over stopping, so it finds the longest token starting there."""
    trie: dict[str, Any] = {}
    for token in tokens:
        node = trie
        for char in token:
            node = node.setdefault(char, {})
        node[""] = {}  # a token ends here

    def emit(node: dict[str, Any]) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


@dataclass(frozen=True, slots=True)
class Framing:
    """What encode(text, add_special_tokens=True) adds around encode(text, add_special_tokens=False)."""

    lead_ids: tuple[int, ...] = ()
    lead_offsets: tuple[tuple[int, int], ...] = ()
    trail_ids: tuple[int, ...] = ()
    trail_offsets: tuple[tuple[int, int], ...] = ()

    def split(self, encoding: Encoding) -> bool:
        """True when `encoding` starts with the lead and ends with the trail (ids and offsets)."""
        ids, offsets = encoding.ids, encoding.offsets
        n_lead, n_trail = len(self.lead_ids), len(self.trail_ids)
        if len(ids) < n_lead + n_trail:
            return False
        if tuple(ids[:n_lead]) != self.lead_ids or tuple(ids[len(ids) - n_trail :]) != self.trail_ids:
            return False
        if not offsets:
            return True
        lead = tuple(tuple(span) for span in offsets[:n_lead])
        trail = tuple(tuple(span) for span in offsets[len(offsets) - n_trail :])
        return lead == self.lead_offsets and trail == self.trail_offsets


def locate_boundaries(
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    boundaries: Sequence[Boundary],
    begin: int,
    end: int,
    boundary_ids: frozenset[int],
) -> list[int] | None:
    """Index in ids[begin:end] of each boundary's special token, or None when the encoding does not line up.

    With offsets a token must sit exactly on the boundary's characters. Without offsets the special-token ids of
    the encoding must be exactly the boundaries' ids, in order (an extra one, e.g. an unknown-token id from the
    model, makes the alignment ambiguous).
    """
    positions: list[int] = []
    if not offsets:
        positions = [index for index in range(begin, end) if ids[index] in boundary_ids]
        if [ids[index] for index in positions] != [token_id for _, _, token_id in boundaries]:
            return None
        return positions
    position = begin
    for start, stop, token_id in boundaries:
        while True:
            try:
                index = ids.index(token_id, position, end)  # type: ignore[call-arg]
            except ValueError:
                return None
            span = offsets[index]
            position = index + 1
            if span[0] == start and span[1] == stop:
                break
        positions.append(index)
    return positions


def encode_after(tokenizer: Tokenizer, text: str, boundary: Boundary) -> tuple[list[int], Offsets] | None:
    """Ids and offsets (in `text` coordinates) of text[boundary end:], encoded behind the boundary's token.

    None when the tokenizer does not give the boundary token back as the first token, alone, on its own span.
    """
    return rest_after(tokenizer.encode(text[boundary[0] :], False), boundary)


def rest_after(encoding: Encoding, boundary: Boundary) -> tuple[list[int], Offsets] | None:
    """The part of encoding(text[boundary start:]) after the boundary token, offsets moved to `text` coordinates."""
    start, end, token_id = boundary
    ids, offsets = encoding.ids, encoding.offsets
    if not ids or ids[0] != token_id:
        return None
    if not offsets:
        return ids[1:], []
    first = offsets[0]
    if first[0] != 0 or first[1] != end - start:
        return None
    return ids[1:], [(a + start, b + start) for a, b in offsets[1:]]


# (left, right) text around a special token in a probe
PROBE_CONTEXTS: tuple[tuple[str, str], ...] = (
    ("", ""),
    ("", "Hello"),
    ("Hello world", " and more"),
    ("a", "b"),
    (" ", " "),
    ("\n", "\n\n"),
    ("line one\n", "\nline two"),
    ("  two spaces  ", "  two spaces  "),
    ("你好", "世界"),
    ("emoji 🎉", "🎉 emoji"),
    ("e\u0301", "\u0301e"),
    ("ﬁ Ａ", "Ａ ﬁ"),
    ("<", ">"),
    ("123", "456"),
    ("tab\t", "\tx"),
    ("def f(x):\n    return x", "\n    pass"),
)
FRAMING_TEXTS: tuple[str, ...] = ("Hello world", "", " leading space", "你好，世界", "line\nbreak", "🎉")
# The named tokens (bos, eos, ..., then additional in order) this many get every context; the others (there
# can be hundreds of reserved ones) get one rotating context.
FULLY_TESTED_TOKENS = 24
MIXED_PROBE_TOKENS = 6
LONG_PROBE_FILLER = "The quick brown fox jumps over the lazy dog; 你好, 🎉!\n" * 300


@dataclass(frozen=True)
class SplitPlan:
    """Where L1 may split: the boundary tokens, and per add_special_tokens value a Framing or a reason it is off."""

    finder: BoundaryFinder | None
    framings: dict[bool, Framing] = field(default_factory=dict)
    disabled: dict[bool, str] = field(default_factory=dict)
    dropped_tokens: dict[str, str] = field(default_factory=dict)


def _candidate_tokens(tokenizer: Tokenizer) -> tuple[dict[str, int], list[str]]:
    """Special-token strings that map to an id, and which of them are named (bos, eos, ..., additional)."""
    special = tokenizer.special_tokens
    named_tokens = [token for token in [*special.named().values(), *special.additional] if token]
    others = [tokenizer.id_to_token(token_id) for token_id in sorted(tokenizer.special_token_ids)]
    candidates: dict[str, int] = {}
    for token in [*named_tokens, *others]:
        if not token or token in candidates:
            continue
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            candidates[token] = token_id
    return candidates, [token for token in named_tokens if token in candidates]


def _atomic_tokens(tokenizer: Tokenizer, candidates: dict[str, int], dropped: dict[str, str]) -> dict[str, int]:
    tokens = list(candidates)
    encodings = tokenizer.encode_batch(tokens, False)
    atomic: dict[str, int] = {}
    for token, encoding in zip(tokens, encodings, strict=True):
        token_id = candidates[token]
        spans_ok = not encoding.offsets or [tuple(span) for span in encoding.offsets] == [(0, len(token))]
        if encoding.ids == [token_id] and spans_ok:
            atomic[token] = token_id
        else:
            dropped[token] = "not encoded as its own single token"
    return atomic


def _find_framing(tokenizer: Tokenizer, texts: Sequence[str]) -> Framing | str:
    """The fixed lead/trail add_special_tokens=True puts around the plain encoding, or why there is none."""
    pairs = [(tokenizer.encode(text, True), tokenizer.encode(text, False)) for text in texts]
    reference_with, reference_without = pairs[0]
    inner = reference_without.ids
    for lead in range(len(reference_with.ids) - len(inner) + 1):
        if reference_with.ids[lead : lead + len(inner)] == inner:
            break
    else:
        return f"add_special_tokens=True does not contain the plain encoding of {texts[0]!r}"
    trail = lead + len(inner)
    spans = [tuple(span) for span in reference_with.offsets]
    framing = Framing(
        lead_ids=tuple(reference_with.ids[:lead]),
        lead_offsets=tuple(spans[:lead]),
        trail_ids=tuple(reference_with.ids[trail:]),
        trail_offsets=tuple(spans[trail:]),
    )
    for text, (with_special, without) in zip(texts, pairs, strict=True):
        if _framed(without, framing) != _plain(with_special):
            return f"add_special_tokens=True is not a fixed prefix/suffix around the plain encoding (on {text!r})"
    return framing


def _plain(encoding: Encoding) -> tuple[list[int], list[tuple[int, int]]]:
    return list(encoding.ids), [tuple(span) for span in encoding.offsets]  # type: ignore[misc]


def _framed(encoding: Encoding, framing: Framing) -> tuple[list[int], list[tuple[int, int]]]:
    ids = [*framing.lead_ids, *encoding.ids, *framing.trail_ids]
    if not encoding.offsets and not framing.lead_offsets and not framing.trail_offsets:
        return ids, []
    spans = [*framing.lead_offsets, *(tuple(span) for span in encoding.offsets), *framing.trail_offsets]
    return ids, spans  # type: ignore[return-value]


def check_splits(
    tokenizer: Tokenizer, finder: BoundaryFinder, framing: Framing, texts: Sequence[str], add_special_tokens: bool
) -> list[str | None]:
    """Per text: None when every way the cache can split it gives exactly encode(text), else what went wrong.

    Runs the cache's own operations — `locate_boundaries` + slicing for inserts, `rest_after` for hits — on
    batched encodes of the texts, of every prefix ending at a boundary, and of every rest behind its boundary.
    """
    boundary_ids = frozenset(finder.token_ids.values())
    fulls = tokenizer.encode_batch(texts, add_special_tokens)
    plans: list[tuple[list[Boundary], list[int]] | str] = []
    prefix_texts: list[str] = []
    rest_texts: list[str] = []
    for text, full in zip(texts, fulls, strict=True):
        if not framing.split(full):
            plans.append("the lead/trail special tokens differ")
            continue
        boundaries = finder.find(text)
        end = len(full.ids) - len(framing.trail_ids)
        positions = locate_boundaries(full.ids, full.offsets, boundaries, len(framing.lead_ids), end, boundary_ids)
        if positions is None:
            plans.append("the special tokens of the encoding do not line up with the text")
            continue
        plans.append((boundaries, positions))
        prefix_texts.extend(text[:stop] for _, stop, _ in boundaries)
        rest_texts.extend(text[start:] for start, _, _ in boundaries)
    prefixes = iter(tokenizer.encode_batch(prefix_texts, add_special_tokens))
    rests = iter(tokenizer.encode_batch(rest_texts, False))
    return [
        plan if isinstance(plan, str) else _check_boundaries(full, framing, *plan, prefixes, rests)
        for full, plan in zip(fulls, plans, strict=True)
    ]


def _check_boundaries(
    full: Encoding,
    framing: Framing,
    boundaries: list[Boundary],
    positions: list[int],
    prefixes: Iterator[Encoding],
    rests: Iterator[Encoding],
) -> str | None:
    ids, spans = _plain(full)
    end = len(ids) - len(framing.trail_ids)
    trail_ids, trail_spans = list(framing.trail_ids), list(framing.trail_offsets) if spans else []
    failure = None
    for boundary, position in zip(boundaries, positions, strict=True):
        prefix, rest_encoding = _plain(next(prefixes)), next(rests)  # consume both, even after a failure
        if failure:
            continue
        if prefix != (ids[: position + 1] + trail_ids, spans[: position + 1] + trail_spans):
            failure = f"encoding the text up to {boundary[1]} alone gives other tokens"
            continue
        rest = rest_after(rest_encoding, boundary)
        if rest is None:
            failure = "the boundary token is not encoded alone at the start of the rest"
        elif (rest[0], rest[1] if spans else []) != (ids[position + 1 : end], spans[position + 1 : end]):
            failure = f"encoding the text after {boundary[1]} on its own gives other tokens"
    return failure


def _token_probes(token: str, contexts: Sequence[tuple[str, str]]) -> list[str]:
    probes = [left + token + right for left, right in contexts]
    left, right = contexts[-1]
    probes.append(left + token + token + right)  # back to back
    return probes


def _mixed_probes(tokens: Sequence[str]) -> list[str]:
    """Texts with several different boundary tokens, shaped like rendered chats."""
    picked = list(tokens[:MIXED_PROBE_TOKENS])
    chat = "".join(
        f"{picked[turn % len(picked)]}{role}\n{body}{picked[(turn + 1) % len(picked)]}\n"
        for turn, (role, body) in enumerate(
            [("system", "You are helpful."), ("user", "Hi 你好 🎉"), ("assistant", "Hello!\n\n  ok"), ("user", "")]
        )
    )
    pairs = zip(picked * 3, PROBE_CONTEXTS, strict=False)
    interleaved = "".join(token + left + right for token, (left, right) in pairs)
    # several thousand tokens: catches encodes that change with length (truncation, padding, windows)
    long = picked[0] + LONG_PROBE_FILLER + picked[-1] + LONG_PROBE_FILLER
    return [chat, interleaved, "".join(picked), " ".join(picked), long]


def _excerpt(text: str) -> str:
    return repr(text) if len(text) <= 120 else f"{text[:100]!r}... ({len(text)} characters)"


def plan_prefix_split(tokenizer: Tokenizer) -> SplitPlan:
    """Test-encode the tokenizer and decide where (and for which add_special_tokens value) L1 may split."""
    try:
        return _plan(tokenizer)
    except (TokenizerError, ValueError, TypeError) as exc:
        return _off(f"test encodes failed: {type(exc).__name__}: {exc}")


def _off(reason: str, dropped: dict[str, str] | None = None) -> SplitPlan:
    """A plan with L1 off for both add_special_tokens values, for `reason`."""
    return SplitPlan(finder=None, disabled={False: reason, True: reason}, dropped_tokens=dropped or {})


def _probes_per_token(atomic: dict[str, int], named: list[str]) -> dict[str, list[str]]:
    """Every context, and back to back, for the named tokens (and the first additional ones); one rotating
    context with the token in the middle and at the end for the rest."""
    fully_tested = set(named[:FULLY_TESTED_TOKENS])
    probes = {}
    for index, token in enumerate(atomic):
        if token in fully_tested:
            probes[token] = _token_probes(token, PROBE_CONTEXTS)
        else:
            left, right = PROBE_CONTEXTS[index % len(PROBE_CONTEXTS)]
            probes[token] = [left + token + right + token]
    return probes


def _length_dependent(tokenizer: Tokenizer) -> bool:
    """A Hugging Face tokenizer set to truncate or pad: how a text encodes then depends on the length of all of it,
    at lengths no probe can reach."""
    rust_tokenizer = getattr(tokenizer, "hf_tokenizer", None)
    return bool(getattr(rust_tokenizer, "truncation", None) or getattr(rust_tokenizer, "padding", None))


def _plan(tokenizer: Tokenizer) -> SplitPlan:
    if _length_dependent(tokenizer):
        return _off("the tokenizer truncates or pads encodings (tokenizer.json truncation/padding)")
    dropped: dict[str, str] = {}
    candidates, named = _candidate_tokens(tokenizer)
    atomic = _atomic_tokens(tokenizer, candidates, dropped)
    if not atomic:
        return _off("no special token is encoded atomically, so there is no safe split point", dropped)
    framings: dict[bool, Framing] = {False: Framing()}
    disabled: dict[bool, str] = {}
    framing_with = _find_framing(tokenizer, [*FRAMING_TEXTS, *(token + " x" for token in list(atomic)[:2])])
    if isinstance(framing_with, str):
        disabled[True] = framing_with
    else:
        framings[True] = framing_with
    # a probe holds one token only, so the finder of all tokens finds just that one in it
    finder = BoundaryFinder(atomic)
    probes = _probes_per_token(atomic, named)
    owners = [token for token, texts in probes.items() for _ in texts]
    texts = [text for token_texts in probes.values() for text in token_texts]
    for flag, framing in framings.items():
        results = check_splits(tokenizer, finder, framing, texts, flag)
        for owner, text, problem in zip(owners, texts, results, strict=True):
            if problem and owner not in dropped:
                dropped[owner] = f"{problem} (add_special_tokens={flag}, probe {_excerpt(text)})"
    usable = {token: token_id for token, token_id in atomic.items() if token not in dropped}
    if not usable:
        return _off("no special token passed the split test encodes", dropped)
    finder = BoundaryFinder(usable)
    ordered = list(dict.fromkeys([token for token in named if token in usable] + list(usable)))
    mixed = _mixed_probes(ordered)
    for flag, framing in list(framings.items()):
        results = zip(mixed, check_splits(tokenizer, finder, framing, mixed, flag), strict=True)
        problem = next((f"{problem} on the mixed probe {_excerpt(text)}" for text, problem in results if problem), None)
        if problem:
            disabled[flag] = problem
            del framings[flag]
    return SplitPlan(finder=finder, framings=framings, disabled=disabled, dropped_tokens=dropped)


FORMAT_VERSION = 1
_SUBDIR = "split-plan"


@cache
def _code_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def plan_key(tokenizer: Tokenizer) -> str | None:
    """The key of this tokenizer's plan, or None when it gives no content fingerprint."""
    special_tokens = repr(tokenizer.special_tokens)
    return content_key(tokenizer, format=FORMAT_VERSION, code=_code_digest(), special_tokens=special_tokens)


def _framing(data: list[list[Any]]) -> Framing:
    lead_ids, lead_offsets, trail_ids, trail_offsets = data
    return Framing(tuple(lead_ids), tuple(map(tuple, lead_offsets)), tuple(trail_ids), tuple(map(tuple, trail_offsets)))


def read_plan(key: str) -> SplitPlan | None:
    data = read_json_entry(_SUBDIR, key)
    if data is None:
        return None
    try:
        return SplitPlan(
            finder=BoundaryFinder(data["boundaries"]) if data["boundaries"] else None,
            framings={value == "true": _framing(framing) for value, framing in data["framings"].items()},
            disabled={value == "true": str(reason) for value, reason in data["disabled"].items()},
            dropped_tokens=dict(data["dropped_tokens"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def write_plan(key: str, plan: SplitPlan) -> None:
    """Store the plan (atomically); a cache that cannot be written is skipped: the front works without it."""
    payload = {
        "boundaries": plan.finder.token_ids if plan.finder is not None else {},
        "framings": {
            json.dumps(value): [f.lead_ids, f.lead_offsets, f.trail_ids, f.trail_offsets]
            for value, f in plan.framings.items()
        },
        "disabled": {json.dumps(value): reason for value, reason in plan.disabled.items()},
        "dropped_tokens": plan.dropped_tokens,
    }
    write_json_entry(_SUBDIR, key, payload)
