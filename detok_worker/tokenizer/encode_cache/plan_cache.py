"""The encode cache's split plan (split_safety.py: test encodes, in the front before it serves) on disk, like
the fast path's tables: a front that starts with a tokenizer seen before reads the plan instead of test-encoding again.

Where: the detok cache directory (`cache_root()`), folder `split-plan/`, one JSON file per key. The key covers
what the plan is a function of: the tokenizer's `content_fingerprint()` (a tokenizer without one is never
cached), its class, vocabulary size, special tokens and special ids (tokenizer_config.json names them, and they
choose the probes), the file format, and a hash of the code that plans (split_safety.py, boundaries.py). A file
that is missing, unreadable or written for another key is ignored and written again; any file may be deleted.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

from detok_worker.tokenizer.encode_cache.boundaries import BoundaryFinder, Framing
from detok_worker.tokenizer.encode_cache.split_safety import SplitPlan
from detok_worker.tokenizer.loading.load_cache import content_key, read_json_entry, write_json_entry
from detok_worker.tokenizer.protocol import Tokenizer

FORMAT_VERSION = 1
_SUBDIR = "split-plan"
_CODE = (Path(__file__).parent / "split_safety.py", Path(__file__).parent / "boundaries.py")


@cache
def _code_digest() -> str:
    return hashlib.sha256(b"".join(path.read_bytes() for path in _CODE)).hexdigest()


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
