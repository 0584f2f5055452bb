"""Decides, per tokenizer and by test encodes, where the L1 prefix cache may split a prompt.

Nothing is assumed from the tokenizer's type or config: every special token is tried as a boundary in a battery
of contexts (whitespace, newlines, CJK, emoji, combining marks, back-to-back tokens, start and end of text), for
both add_special_tokens values, through the very operations the cache performs on a hit (`encode_after`) and on
an insert (`locate_boundaries` + slicing). A token that fails anywhere is not used as a boundary; if the
tokenizer's add_special_tokens=True output is not a fixed lead/trail around its add_special_tokens=False output,
or a mixed multi-token probe fails, L1 is off for that add_special_tokens value, and the reason says why.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from detok_worker.tokenizer.encode_cache.boundaries import (
    Boundary,
    BoundaryFinder,
    Framing,
    locate_boundaries,
    rest_after,
)
from detok_worker.tokenizer.protocol import Encoding, Tokenizer, TokenizerError

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
    named = [special.bos, special.eos, special.unk, special.sep, special.pad, special.cls, special.mask]
    named_tokens = [token for token in [*named, *special.additional] if token]
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
        reason = f"test encodes failed: {type(exc).__name__}: {exc}"
        return SplitPlan(finder=None, disabled={False: reason, True: reason})


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
        reason = "the tokenizer truncates or pads encodings (tokenizer.json truncation/padding)"
        return SplitPlan(finder=None, disabled={False: reason, True: reason})
    dropped: dict[str, str] = {}
    candidates, named = _candidate_tokens(tokenizer)
    atomic = _atomic_tokens(tokenizer, candidates, dropped)
    if not atomic:
        reason = "no special token is encoded atomically, so there is no safe split point"
        return SplitPlan(finder=None, disabled={False: reason, True: reason}, dropped_tokens=dropped)
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
        reason = "no special token passed the split test encodes"
        return SplitPlan(finder=None, disabled={False: reason, True: reason}, dropped_tokens=dropped)
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
