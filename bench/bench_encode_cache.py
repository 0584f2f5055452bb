"""Benchmark: the front's encode cache (L0 exact match, L1 special-token prefixes) on chat prompts.

Reproduces the reference design's four scenarios, every prompt rendered through the tokenizer's real chat template
(the embedded Qwen3 by default; --tokenizer DIR for another, e.g. Llama 3 from build_fixtures.py --restricted):
- realistic chat: one ~8 KB system prompt, 100 different user questions, the set sent 5 times (the reference
  loops its prompt set; repeats are what L0 is for);
- customer service: a shared ~8 KB system prompt, 200 different customer questions, each sent once (no
  repeats: only L1 can help);
- multi-turn: 20 conversations of 6 turns; each turn sends the whole history plus the new question, once;
- code review: ~2.5 KB review guidelines, 40 different code snippets, each sent once;
- one-off messages: 200 chats of one user message, a different 1,024-character corpus passage each, once (what
  `bench_http.py --request-cost` sends: nothing for a cache, the encode itself).

Each scenario runs uncached, L0 only, L1 only and L0+L1 (the default sizes: 10,000 entries, 50 MB), from a cold
cache (no priming), and reports ops/s, µs per encode, hit rates and the speedup over uncached; encodes go as the
front's do, through tiktoken where it takes the tokenizer (--library-encode: the tokenizers library only). Every
cached result is checked against the uncached encode (outside the timed loop). Times are CPU time of this process
(time.process_time: the tokenizer encodes on this thread), the median of --repeat runs; each run measures every
cache level of a scenario back to back, so the speedups are ratios within one run. /proc/loadavg is printed
before and after.

    python bench/bench_encode_cache.py [--repeat 5] [--markdown] [--tokenizer DIR] [--scenario "customer service"]
                                       [--library-encode]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import corpus_text  # noqa: E402

from detok_worker.tokenizer import load_default_tokenizer  # noqa: E402
from detok_worker.tokenizer.encode_cache import CachedTokenizer, split_plan_for  # noqa: E402
from detok_worker.tokenizer.loading.factory import create_tokenizer  # noqa: E402
from detok_worker.tokenizer.protocol import Tokenizer  # noqa: E402

L0_ENTRIES = 10_000
L1_BYTES = 50 * 1024 * 1024
LEVELS: dict[str, dict[str, int]] = {
    "uncached": {},
    "L0 only": {"l0_max_entries": L0_ENTRIES},
    "L1 only": {"l1_max_memory": L1_BYTES},
    "L0+L1": {"l0_max_entries": L0_ENTRIES, "l1_max_memory": L1_BYTES},
}

NOUNS = [
    "order",
    "refund",
    "invoice",
    "laptop",
    "phone",
    "charger",
    "warranty",
    "account",
    "password",
    "address",
    "parcel",
    "subscription",
]
VERBS = [
    "return",
    "replace",
    "cancel",
    "track",
    "update",
    "reset",
    "upgrade",
    "transfer",
    "activate",
    "renew",
    "verify",
    "change",
]
ADJECTIVES = [
    "broken",
    "late",
    "damaged",
    "missing",
    "wrong",
    "expired",
    "duplicate",
    "blocked",
    "slow",
    "noisy",
    "cracked",
    "unused",
]
TOPICS = [
    "What is the capital of France?",
    "Explain quantum mechanics in simple terms.",
    "How do I sort an array in Python?",
    "What are the benefits of exercise?",
    "Can you help me write a resume?",
]


def policy_text(rng: random.Random, target_chars: int) -> str:
    """Varied policy prose of about target_chars characters (not one sentence repeated)."""
    lines = []
    size = 0
    rule = 1
    while size < target_chars:
        noun, verb, adjective = rng.choice(NOUNS), rng.choice(VERBS), rng.choice(ADJECTIVES)
        days = rng.choice([7, 14, 30, 60, 90])
        line = (
            f"{rule}. If a customer wants to {verb} a {adjective} {noun}, confirm the {noun} number first, "
            f"check that it is within {days} days, and explain the next step politely; escalate to team "
            f"{rng.randint(1, 9)} when the amount exceeds ${rng.randint(50, 2000)}."
        )
        lines.append(line)
        size += len(line) + 1
        rule += 1
    return "You are the customer service assistant of TechCorp.\n" + "\n".join(lines)


def question(rng: random.Random, index: int) -> str:
    noun, verb, adjective = rng.choice(NOUNS), rng.choice(VERBS), rng.choice(ADJECTIVES)
    return f"Hi, my {noun} arrived {adjective}. Can I {verb} it? Order #{10_000 + index}, thanks!"


def code_snippet(rng: random.Random, index: int) -> str:
    name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}_{index}"
    return (
        f"def {name}(items, limit={rng.randint(1, 100)}):\n"
        f"    result = []\n"
        f"    for item in items:\n"
        f"        if item.{rng.choice(NOUNS)} > limit:\n"
        f"            result.append(item)  # {rng.choice(ADJECTIVES)}\n"
        f"    return sorted(result, key=lambda x: x.{rng.choice(NOUNS)})\n"
    )


def chat(tokenizer: Tokenizer, system: str | None, turns: list[tuple[str, str | None]]) -> str:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system is not None else []
    for user, assistant in turns:
        messages.append({"role": "user", "content": user})
        if assistant is not None:
            messages.append({"role": "assistant", "content": assistant})
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def scenarios(tokenizer: Tokenizer) -> dict[str, tuple[list[str], int]]:
    """name -> (prompts, passes over them)."""
    rng = random.Random(2024)
    big_system = policy_text(rng, 8000)
    realistic = [chat(tokenizer, big_system, [(f"{TOPICS[i % 5]} (Query #{i})", None)]) for i in range(100)]
    service_system = policy_text(rng, 8000)
    service = [chat(tokenizer, service_system, [(question(rng, i), None)]) for i in range(200)]
    coding_system = "You are a helpful coding assistant. Help users write better code. " * 10
    multi_turn = []
    for conversation in range(20):
        turns: list[tuple[str, str | None]] = []
        for turn in range(6):
            turns.append((f"Conversation {conversation}, question {turn}: {question(rng, turn)}", None))
            multi_turn.append(chat(tokenizer, coding_system, turns))
            turns[-1] = (turns[-1][0], f"Answer {turn}: you can {rng.choice(VERBS)} the {rng.choice(NOUNS)}.")
    guidelines = (
        "You are a code review assistant. Check for: 1) code quality and readability 2) performance issues "
        "3) security vulnerabilities 4) best practices 5) documentation completeness. "
    ) * 15
    review = [
        chat(tokenizer, guidelines, [(f"Review this code:\n```\n{code_snippet(rng, i)}```", None)]) for i in range(40)
    ]
    corpus = corpus_text()
    one_off = [
        chat(tokenizer, None, [(corpus[start : start + 1024], None)])
        for start in ((index * 7919) % (len(corpus) - 1024) for index in range(200))
    ]
    return {
        "realistic chat": (realistic, 5),
        "customer service": (service, 1),
        "multi-turn": (multi_turn, 1),
        "code review": (review, 1),
        "one-off messages": (one_off, 1),
    }


@dataclass
class Row:
    scenario: str
    level: str
    prompts: int
    average_chars: int
    encodes: int
    seconds: float
    l0_hit_rate: float | None
    l1_hit_rate: float | None


def run(tokenizer: Tokenizer, level: str, prompts: list[str], passes: int) -> tuple[float, Any]:
    encoder = CachedTokenizer(tokenizer, **LEVELS[level]) if LEVELS[level] else tokenizer
    start = time.process_time()
    for _ in range(passes):
        for prompt in prompts:
            encoder.encode(prompt)
    elapsed = time.process_time() - start
    return elapsed, encoder


def check_exact(tokenizer: Tokenizer, cached: Any, prompts: list[str]) -> None:
    for prompt in prompts:
        got, want = cached.encode(prompt), tokenizer.encode(prompt)
        if (got.ids, got.offsets) != (want.ids, want.offsets):
            raise SystemExit(f"MISMATCH on {prompt[:80]!r}")


def measure(tokenizer: Tokenizer, repeat: int, only: list[str] | None) -> list[Row]:
    rows = []
    for name, (prompts, passes) in scenarios(tokenizer).items():
        if only and name not in only:
            continue
        samples: dict[str, list[float]] = {level: [] for level in LEVELS}
        encoders: dict[str, Any] = {}
        for _ in range(repeat):
            for level in LEVELS:  # every level in each run: the ratios compare one run's conditions
                seconds, encoders[level] = run(tokenizer, level, prompts, passes)
                samples[level].append(seconds)
        for level in LEVELS:
            encoder = encoders[level]
            l0_rate = l1_rate = None
            if isinstance(encoder, CachedTokenizer):
                stats = encoder.stats()
                l0_rate = stats.l0.hit_rate if stats.l0.enabled else None
                l1_rate = stats.l1.hit_rate if stats.l1.enabled else None
                check_exact(tokenizer, encoder, prompts)
            average_chars = sum(map(len, prompts)) // len(prompts)
            seconds = statistics.median(samples[level])
            rows.append(Row(name, level, len(prompts), average_chars, len(prompts) * passes, seconds, l0_rate, l1_rate))
    return rows


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def table(rows: list[Row], markdown: bool) -> str:
    baseline = {row.scenario: row.seconds / row.encodes for row in rows if row.level == "uncached"}
    header = [
        "scenario",
        "cache",
        "prompts",
        "avg chars",
        "encodes",
        "ops/s",
        "µs/encode",
        "L0 hit",
        "L1 hit",
        "speedup",
    ]
    lines = []
    for row in rows:
        per_op = row.seconds / row.encodes
        lines.append(
            [
                row.scenario,
                row.level,
                str(row.prompts),
                f"{row.average_chars:,}",
                str(row.encodes),
                f"{1 / per_op:,.0f}",
                f"{per_op * 1e6:,.1f}",
                "-" if row.l0_hit_rate is None else f"{row.l0_hit_rate:.1%}",
                "-" if row.l1_hit_rate is None else f"{row.l1_hit_rate:.1%}",
                f"{baseline[row.scenario] / per_op:.1f}x",
            ]
        )
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*x) for x in lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration; the median is reported")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--tokenizer", help="tokenizer directory or file (default: the embedded Qwen3)")
    parser.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    parser.add_argument(
        "--library-encode",
        action="store_true",
        help="encode through the tokenizers library only (default: as the front does, through tiktoken where it "
        "takes the tokenizer: backends/hf_tiktoken.py)",
    )
    args = parser.parse_args(argv)
    tokenizer = create_tokenizer(args.tokenizer) if args.tokenizer else load_default_tokenizer()
    build_encoder = getattr(tokenizer, "build_tiktoken_encoder", None)
    if build_encoder is not None and not args.library_encode:
        print(f"encoder: {'tiktoken' if build_encoder() else 'the tokenizers library'}", file=sys.stderr)
    started = time.perf_counter()
    split_plan_for(tokenizer)
    print(
        f"split check of {tokenizer.name}: {time.perf_counter() - started:.3f} s (once per tokenizer)", file=sys.stderr
    )
    print(f"load average before: {load_average()}", file=sys.stderr)
    rows = measure(tokenizer, args.repeat, args.scenario)
    print(f"load average after: {load_average()}", file=sys.stderr)
    print(table(rows, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
