"""Exactness of bench_vllm.py: how each stream's text differs from vLLM's own server's text of the same seeded
request and from HF `tokenizers`' decode of vLLM's ids, and that reference kept on disk for runs without vLLM."""

from __future__ import annotations

import json
import os
import sys

from common import RESULTS_DIR
from sse_client import StreamOutput
from tokenizers import Tokenizer

REFERENCE_FILE = RESULTS_DIR / "vllm-reference.json"
Reference = dict[int, dict[int, StreamOutput]]  # clients -> seed -> vLLM's text and ids


def difference(text: str, reference: str) -> str:
    """How a text differs from a reference: equal, an unfinished last character (U+FFFD) that only one of them
    has, or other."""
    if text == reference:
        return "equal"
    if reference.startswith(text) and reference.endswith("\ufffd"):
        return "fffd_ref"
    if text.startswith(reference) and text.endswith("\ufffd"):
        return "fffd_here"
    return "other"


def check_exact(
    system: str, clients: int, outputs: dict[int, StreamOutput], reference: Reference, decoder: Tokenizer
) -> dict[str, int]:
    """Counts of how each finished stream's text differs from vLLM's text and from the full decode of its ids."""
    counts = {"checked": 0}
    for seed, output in outputs.items():
        expected = reference.get(clients, {}).get(seed)
        if output.error is not None or expected is None:
            continue
        counts["checked"] += 1
        decoded = decoder.decode(expected.token_ids, skip_special_tokens=True)
        for against, text in (("vllm", expected.text), ("decode", decoded)):
            kind = difference(output.text, text)
            counts[f"{against}_{kind}"] = counts.get(f"{against}_{kind}", 0) + 1
            if kind == "other" and counts[f"{against}_other"] <= 3:
                at = len(os.path.commonprefix([output.text, text]))
                print(
                    f"MISMATCH {system} {clients} seed {seed} vs {against} at char {at}: "
                    f"{output.text[at : at + 30]!r} vs {text[at : at + 30]!r}",
                    file=sys.stderr,
                )
    return counts


def load_reference(max_tokens: int, vocab: str) -> Reference:
    """The reference of the last run with vLLM's own server at this max_tokens and model vocabulary, or none."""
    if not REFERENCE_FILE.is_file():
        return {}
    stored = json.loads(REFERENCE_FILE.read_text())
    if (stored["max_tokens"], stored.get("vocab")) != (max_tokens, vocab):
        return {}
    return {
        int(clients): {int(seed): StreamOutput(item["text"], item["ids"], None) for seed, item in level.items()}
        for clients, level in stored["levels"].items()
    }


def save_reference(max_tokens: int, vocab: str, reference: Reference) -> None:
    levels = {
        str(clients): {str(seed): {"text": output.text, "ids": output.token_ids} for seed, output in level.items()}
        for clients, level in reference.items()
    }
    REFERENCE_FILE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE_FILE.write_text(
        json.dumps({"max_tokens": max_tokens, "vocab": vocab, "levels": levels}, ensure_ascii=False)
    )


EXACT_COLUMNS = [("system", "system", "s"), ("clients", "clients", "d"), ("checked", "checked", "d")] + [
    (f"{against}_{kind}", f"{label} {kind_label}", "d")
    for against, label in (("vllm", "vs vLLM:"), ("decode", "vs decode:"))
    for kind, kind_label in (("equal", "equal"), ("fffd_here", "U+FFFD here"), ("fffd_ref", "U+FFFD there"))
    + (("other", "other"),)
]
