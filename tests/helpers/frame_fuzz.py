"""A seeded generator of bad bus frames for the fuzz tests: valid messages of a direction, mutated.

Mutations: truncation, bit flips, a wrong or unknown tag, a field replaced by a value of another type, huge and
negative ints, NaN/inf, nested garbage, random bytes, invalid UTF-8 inside a string, empty frames; plus
semantically bad but well-formed messages (unknown rids, duplicate opens, out-of-range and negative token ids,
too many / too long stop strings, batch columns of different lengths, extras naming no row) and multi-part
messages. Every frame is recorded with whether it is structurally invalid on its own (not msgpack at all, or
multi-part): a receiver must count at least those."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from detok_worker.bus.columns import token_batch
from detok_worker.bus.messages import (
    Abort,
    Delivered,
    DetokParams,
    EngineStats,
    Finish,
    Heartbeat,
    Hello,
    Open,
    PromptLogprobs,
    Reject,
    RequestParams,
    SamplingParams,
    Submit,
    TextBatch,
    TextDelta,
    TextExtras,
    TokenBatch,
    Tokens,
    WorkerStats,
)
from helpers.bus_rows import text_batch

HUGE_INTS = [2**63 - 1, -(2**63), 2**64 - 1, 2**32, -1, -(2**31)]
TAGS = ["submit", "abort", "delivered", "token_batch", "shutdown", "hello", "heartbeat", "finish", "goodbye",
        "text_batch", "worker_stats", "reject", "prompt_logprobs", "engine_stats", "open", "tokens", "delta", "nope",
        ""]  # fmt: skip


@dataclass(frozen=True)
class Fuzzed:
    parts: list[bytes]  # one frame, or several for a multi-part message
    invalid: bool  # not msgpack, or multi-part: every receiver must count it as bad


class FrameFuzzer:
    """Messages from `make_valid(rng)` (valid in shape, some bad in meaning), mutated."""

    def __init__(self, seed: int, make_valid: Callable[[random.Random], list[object]]) -> None:
        self.rng = random.Random(seed)
        self.make_valid = make_valid

    def frames(self, count: int) -> list[Fuzzed]:
        return [self.one() for _ in range(count)]

    def one(self) -> Fuzzed:
        rng = self.rng
        message = rng.choice(self.make_valid(rng))
        frame = msgspec.msgpack.encode(message)
        kind = rng.randrange(12)
        if kind == 0:
            return self._checked(frame[: rng.randrange(len(frame))])
        if kind == 1:
            data = bytearray(frame)
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            return self._checked(bytes(data))
        if kind == 2:
            return self._checked(rng.randbytes(rng.randint(0, 300)))
        if kind == 3:
            return Fuzzed([frame, rng.randbytes(rng.randint(0, 20))], invalid=True)
        if kind == 4:
            return self._checked(self._bad_utf8(frame))
        tree = msgspec.msgpack.decode(frame)
        if kind == 5:
            tree[0] = rng.choice(TAGS)
        elif kind == 6:
            self._replace_random(tree, lambda: self._garbage(depth=0))
        elif kind == 7:
            self._replace_random(tree, lambda: rng.choice(HUGE_INTS))
        elif kind == 8:
            self._replace_random(tree, lambda: rng.choice([math.nan, math.inf, -math.inf, 1e308, -0.0]))
        elif kind == 9:  # deep nesting, written by hand (an encoder would hit its own recursion limit)
            depth = rng.randint(50, 5000)
            return self._checked(rng.choice([b"\x91", b"\x81\xa1k"]) * depth + b"\x90")
        elif kind == 10:
            tree = tree[: rng.randrange(len(tree))] + ([] if rng.random() < 0.5 else [1, "x", None])
        # kind 11: the valid message itself (semantic faults are in make_valid)
        return Fuzzed([msgspec.msgpack.encode(tree)], invalid=False)

    def _checked(self, frame: bytes) -> Fuzzed:
        try:
            msgspec.msgpack.decode(frame)
        except (msgspec.DecodeError, ValueError, RecursionError):
            return Fuzzed([frame], invalid=True)
        return Fuzzed([frame], invalid=False)

    def _bad_utf8(self, frame: bytes) -> bytes:
        """Overwrite the bytes of the first string (fixstr) with invalid UTF-8."""
        for index, byte in enumerate(frame):
            if 0xA1 <= byte <= 0xBF and index + 1 + (byte - 0xA0) <= len(frame):
                length = byte - 0xA0
                return frame[: index + 1] + b"\xff" * length + frame[index + 1 + length :]
        return frame + b"\xc1"

    def _garbage(self, depth: int) -> Any:
        rng = self.rng
        choices: list[Callable[[], Any]] = [
            lambda: None,
            lambda: rng.random() < 0.5,
            lambda: rng.choice(HUGE_INTS),
            lambda: rng.random() * 1e6,
            lambda: "".join(
                chr(rng.choice([rng.randrange(32, 0xD800), rng.randrange(0xE000, 0x2FFFF)]))
                for _ in range(rng.randint(0, 30))
            ),
            lambda: rng.randbytes(rng.randint(0, 30)),
        ]
        if depth < 4:
            choices += [
                lambda: [self._garbage(depth + 1) for _ in range(rng.randint(0, 5))],
                lambda: {str(rng.randrange(100)): self._garbage(depth + 1) for _ in range(rng.randint(0, 4))},
            ]
        return rng.choice(choices)()

    def _replace_random(self, tree: list[Any], value: Callable[[], Any]) -> None:
        """Replace one element somewhere in the tree (not the tag) with value()."""
        node: Any = tree
        for _ in range(4):
            children = [i for i in range(len(node)) if node is not tree or i > 0]
            if not children:
                break
            index = self.rng.choice(children)
            if isinstance(node[index], list) and node[index] and self.rng.random() < 0.6:
                node = node[index]
                continue
            node[index] = value()
            return
        if node is not tree:
            node.append(value())


# ---- valid (and semantically bad) messages of each direction ------------------------------------------------


def random_rid(rng: random.Random) -> str:
    return rng.choice(["", "r", f"cmpl-{rng.getrandbits(64):x}", "x" * rng.randint(1, 300), "\x00"])


def detok_params(rng: random.Random) -> DetokParams:
    stop = [] if rng.random() < 0.5 else ["a" * rng.randint(1, 3000) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.2:
        stop = [f"s{i}" for i in range(rng.randint(65, 2000))]  # more than worker.max_stop_strings
    stop_ids = [rng.choice([-5, 0, 151643, 10**9, 2**63 - 1]) for _ in range(rng.randint(0, 3))]
    return DetokParams(stop, stop_ids, rng.random() < 0.5, rng.random() < 0.5, rng.choice([0, 3, -1, 2**40]))


def token_ids(rng: random.Random, count: int) -> list[int]:
    return [rng.choice([rng.randrange(151_000), -1, 151_669, 10**9, 2**63 - 1]) for _ in range(count)]


def to_engine_messages(rng: random.Random) -> list[object]:
    """front -> engine (Submit/Abort/Delivered), plus a worker's message on the wrong socket."""
    rid = random_rid(rng)
    sampling = SamplingParams(prompt_logprobs=rng.choice([None, 0, 5, -1, -7, 2**63 - 1]))
    params = RequestParams(rng.choice([1, 5, 0, -3, 2**63 - 1]), detok_params(rng), rng.random() < 0.5, sampling)
    submit = Submit(rid, token_ids(rng, rng.randint(0, 12)), params, rng.choice([0, -1, 2**63 - 1]))
    return [submit, submit, Abort(rid), Delivered(rid), Hello("x", 1)]


def from_worker_messages(rng: random.Random) -> list[object]:
    """worker -> engine, sent by a DEALER the engine never asked for."""
    return [
        Heartbeat("fuzzer", rng.choice([0, 1, -1, 2**63 - 1])),
        Finish(random_rid(rng), rng.choice(["stop", "error", "bogus"]), rng.choice([None, "x", -1, 2**63 - 1])),
        Hello("fuzzer", rng.choice([1, -1, 2**63 - 1])),
        Submit("r", [1], RequestParams(1)),
    ]


def to_worker_messages(rng: random.Random) -> list[object]:
    """engine -> worker: TokenBatches with bad params, bad ids, duplicate opens, unknown rids (never Shutdown)."""
    rids = [random_rid(rng) for _ in range(3)]
    opens = [Open(rid, token_ids(rng, rng.randint(0, 8)), detok_params(rng)) for rid in rids]
    opens += opens[: rng.randint(0, 2)]  # duplicate opens
    finishes = [None, None, "length", "abort", "error", "bogus"]
    items = [
        (rng.choice([*rids, random_rid(rng)]), Tokens(token_ids(rng, rng.randint(0, 6)), rng.choice(finishes)))
        for _ in range(rng.randint(0, 5))
    ]
    batch = token_batch(1, 0, [], items)
    disagreeing = TokenBatch(2, 0, [], [*batch.rids, random_rid(rng)], batch.ids, batch.extras)  # a rid with no id
    beyond = TokenBatch(3, 0, [], batch.rids, batch.ids, {len(batch.rids) + rng.choice([0, 7]): Tokens([1])})
    return [token_batch(rng.randrange(1000), 0, opens, items), batch, disagreeing, beyond, Heartbeat("x", 1)]


def to_front_messages(rng: random.Random) -> list[object]:
    """worker/engine -> front."""
    rid = random_rid(rng)
    delta = TextDelta(
        rid,
        rng.choice([0, -5, 2**63 - 1]),
        "tëxt😀",
        rng.choice([0, -1, 5]),
        finish=rng.choice([None, "stop", "error", "bogus"]),
    )
    batch = text_batch("w", 0, rng.choice([0, -1]), [delta, delta])
    columns = (batch.rids, batch.offsets, batch.texts, batch.n_tokens)
    return [
        batch,
        TextBatch("w", 0, 1, batch.rids, batch.offsets[:1], batch.texts, batch.n_tokens, batch.extras),
        TextBatch("w", 0, 1, *columns, {rng.choice([-1, 2]): TextExtras()}),
        WorkerStats(f"fuzz-{rng.randrange(10**6)}", -1, rng.choice([0, -3, 2**63 - 1]), {"x": -1}, -1, 2**63 - 1),
        Reject(rid, "fuzzed"),
        PromptLogprobs(rid, [[1, 2], [-3], []], [[-0.5, float("nan")], [], [float("-inf")]], [1, -1]),
        EngineStats(rng.choice([0, -1]), {"fuzz": -1}, {"x": 2**63 - 1}, -1, 0),
        Submit("r", [1], RequestParams(1)),
    ]  # fmt: skip
