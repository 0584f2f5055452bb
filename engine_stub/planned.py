"""The planning sources: for a submitted request, every output id the local engine will "generate", at once; and
`PlannedEngine`, which generates those plans as an engine would, pushing each step's ids to the EngineLink.

- corpus: the tokens of one passage of the text corpus (chosen per rid by a seeded RNG), then EOS; the ids of
  every passage are encoded at start, or read from their disk cache (`passage_ids`);
- echo: the prompt's own ids, then EOS (a client can predict the exact output);
- trace: the output ids of a recorded trace's requests, round robin, paced as recorded (engine.replay_speed;
  0 = as fast as the engine steps).
(llama-cpp, a real model, generates step by step instead: `LlamaSource`.) A plan is cut to max_tokens; EOS at the
end survives only if it fits.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

from detok_worker.bus.messages import FINISH_LENGTH, FINISH_STOP, RequestParams, TokenLogprob
from detok_worker.engine.scheduler import Output
from detok_worker.engine.sources.base import SourceError
from detok_worker.tokenizer.loading.load_cache import content_key, read_json_entry, write_json_entry
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import Trace
from engine_stub.generators import Admission

PASSAGE_SEPARATOR = "%%"  # a line of its own between passages of a corpus file


@dataclass(frozen=True, slots=True)
class Plan:
    """What a request will generate: its output ids (before max_tokens truncation) and, for paced sources, the
    time after the request's arrival at which each id may be emitted (None: one step per tokens_per_step)."""

    ids: list[int]
    offsets_ns: list[int] | None = None


class TokenSource(Protocol):
    name: str

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan: ...


def primary_eos_id(tokenizer: Tokenizer) -> int | None:
    """The id a generation ends with: the tokenizer's eos token if it is one of its eos ids, else the smallest."""
    eos_ids = tokenizer.eos_token_ids
    eos = tokenizer.special_tokens.eos
    token_id = tokenizer.token_to_id(eos) if eos else None
    if token_id is not None and (token_id in eos_ids or not eos_ids):
        return token_id
    return min(eos_ids) if eos_ids else None


def _with_eos(ids: Sequence[int], eos_id: int | None) -> list[int]:
    return [*ids, eos_id] if eos_id is not None else list(ids)


class EchoSource:
    name = "echo"

    def __init__(self, eos_id: int | None) -> None:
        self.eos_id = eos_id

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan:
        return Plan(_with_eos(prompt_ids, self.eos_id))


def split_passages(text: str) -> list[str]:
    passages: list[str] = []
    current: list[str] = []
    for line in [*text.splitlines(), PASSAGE_SEPARATOR]:
        if line.strip() == PASSAGE_SEPARATOR:
            passage = "\n".join(current).strip("\n")
            if passage.strip():
                passages.append(passage)
            current = []
        else:
            current.append(line)
    return passages


def load_corpus(directory: str | Path | None = None) -> list[str]:
    """Passages of every *.txt file in `directory` (default: the shipped corpus, corpus/), in name order."""
    try:
        if directory:
            files = sorted(Path(directory).glob("*.txt"))
            texts = [file.read_text(encoding="utf-8") for file in files]
        else:
            root = resources.files("engine_stub") / "corpus"
            entries = sorted((e for e in root.iterdir() if e.name.endswith(".txt")), key=lambda e: e.name)
            texts = [entry.read_text(encoding="utf-8") for entry in entries]
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read corpus {directory or '(shipped)'}: {exc}") from exc
    passages = [passage for text in texts for passage in split_passages(text)]
    if not passages:
        raise SourceError(f"corpus {directory or '(shipped)'} holds no passages (*.txt files separated by %%)")
    return passages


# The token ids of the corpus source's passages, on disk per tokenizer content and corpus text, so an engine
# whose tokenizer defers building the library tokenizer (`HFTokenizer`) never builds it for
# the corpus: with the ids here and the EOS and special ids from the tokenizer load cache, the engine starts without
# `Tokenizer.from_str` and plans every request by a lookup.
#
# Where: the detok cache directory (`cache_root()`, as for the other disk caches), folder `corpus-ids/`, one JSON
# file per key (`content_key`: the tokenizer's content fingerprint, a tokenizer without one is never cached, and
# a sha256 of every passage). A missing or unreadable file, or one written for another key, is ignored and
# written again; any file may be deleted at any time.

_CORPUS_IDS_FORMAT = 1
_CORPUS_IDS_SUBDIR = "corpus-ids"


def corpus_key(tokenizer: Tokenizer, passages: list[str]) -> str | None:
    """The key of these passages' ids under this tokenizer, or None when the tokenizer gives no content
    fingerprint."""
    corpus = hashlib.sha256("\x00".join(passages).encode("utf-8", "surrogatepass")).hexdigest()
    return content_key(tokenizer, format=_CORPUS_IDS_FORMAT, passages=len(passages), corpus=corpus)


def read_corpus_ids(key: str, count: int) -> list[list[int]] | None:
    """The ids of `count` passages stored under `key`, or None."""
    data = read_json_entry(_CORPUS_IDS_SUBDIR, key)
    if data is None:
        return None
    try:
        ids = data["ids"]
        if len(ids) != count:
            return None
        return [[int(i) for i in passage] for passage in ids]
    except (ValueError, KeyError, TypeError):
        return None


def passage_ids(tokenizer: Tokenizer, passages: list[str]) -> list[list[int]] | None:
    """The ids of every passage (no special tokens added), from the cache or encoded now and stored; None for a
    tokenizer without a content fingerprint (the source then encodes each passage at its first use)."""
    key = corpus_key(tokenizer, passages)
    if key is None:
        return None
    ids = read_corpus_ids(key, len(passages))
    if ids is None:
        ids = [encoding.ids for encoding in tokenizer.encode_batch(passages)]
        write_json_entry(_CORPUS_IDS_SUBDIR, key, {"ids": ids})  # a cache that cannot be written is skipped
    return ids


class CorpusSource:
    name = "corpus"

    def __init__(
        self,
        tokenizer: Tokenizer,
        passages: list[str],
        eos_id: int | None,
        seed: int = 0,
        passage_ids: list[list[int]] | None = None,
    ) -> None:
        """`passage_ids`: every passage's ids, known beforehand (`passage_ids`, below); else each passage is
        encoded at its first use."""
        self.tokenizer = tokenizer
        self.passages = passages
        self.eos_id = eos_id
        self.seed = seed
        self._ids: dict[int, list[int]] = dict(enumerate(passage_ids)) if passage_ids is not None else {}

    def passage_index(self, rid: str) -> int:
        return random.Random(f"{self.seed}/{rid}").randrange(len(self.passages))

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan:
        index = self.passage_index(rid)
        ids = self._ids.get(index)
        if ids is None:
            ids = self._ids[index] = self.tokenizer.encode(self.passages[index]).ids
        return Plan(_with_eos(ids, self.eos_id))


class TraceSource:
    name = "trace"

    def __init__(self, trace: Trace, speed: float = 0.0) -> None:
        if not trace.requests:
            raise SourceError("the trace holds no requests")
        self._requests = itertools.cycle(trace.requests)
        self.speed = speed

    def plan(self, rid: str, prompt_ids: Sequence[int], params: RequestParams) -> Plan:
        recorded = next(self._requests)
        if self.speed == 0:
            return Plan(list(recorded.output_ids))
        offsets = [int((t - recorded.t_ns) / self.speed) for t in recorded.token_times_ns]
        return Plan(list(recorded.output_ids), offsets)


@dataclass(slots=True)
class _Planned:
    rid: str
    ids: list[int]  # cut to max_tokens
    finish: str  # once every id is out
    release_ns: list[int] | None  # paced (replay): when each id may go out (monotonic ns)
    logprobs: list[TokenLogprob] | None
    sent: int = 0  # ids pushed so far


class PlannedEngine:
    """Planned requests generated step by step, as an engine would: at most max_batch at once (the rest wait in
    arrival order); each step gives tokens_per_step ids of every running request, or when it is paced (a trace
    replayed at recorded speed) every id whose time has come. A request whose worker has not taken its last ids yet
    (`backlog`: its queue is full) waits: the ids go out as fast as its worker takes them, no faster."""

    def __init__(self, max_batch: int | None, tokens_per_step: int) -> None:
        """`max_batch` None: no cap (every request runs from its arrival)."""
        self.tokens_per_step = tokens_per_step
        self.requests: Admission[_Planned] = Admission(max_batch)

    def add(
        self,
        rid: str,
        ids: list[int],
        max_tokens: int,
        *,
        finish: str | None = None,
        release_ns: list[int] | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> None:
        """Queue a request whose output is `ids`, cut to max_tokens (then it ends "length", else with `finish`,
        "stop" by default); `release_ns` paces them; `logprobs`: one per id, for a request that asked. A rid
        already here is ignored."""
        if rid in self.requests:
            return
        end = finish or FINISH_STOP
        if len(ids) > max_tokens:
            ids, end = ids[:max_tokens], FINISH_LENGTH
        release = None if release_ns is None else release_ns[: len(ids)]
        self.requests.add(rid, _Planned(rid, ids, end, release, None if logprobs is None else logprobs[: len(ids)]))

    def cancel(self, rid: str) -> None:
        self.requests.remove(rid)

    def has_work(self) -> bool:
        return self.requests.has_work()

    def next_release_ns(self) -> int | None:
        """Earliest time a paced request has its next id; None if none is waiting on time."""
        running = self.requests.running.values()
        times = [p.release_ns[p.sent] for p in running if p.release_ns and p.sent < len(p.release_ns)]
        return min(times) if times else None

    def step(self, now_ns: int, backlog: Callable[[str], int] | None) -> list[Output]:
        """The new ids of every running request that has some (and the finish of those that end). `backlog`: the
        ids of a rid its worker has not taken yet (None: the link holds none back)."""
        running, tokens_per_step = self.requests.admit(), self.tokens_per_step
        out: list[Output] = []
        ended: list[str] = []
        for rid, planned in running.items():
            if backlog is not None and backlog(rid):
                continue
            start, ids = planned.sent, planned.ids
            if planned.release_ns is None:
                end = start + tokens_per_step
                if end > len(ids):
                    end = len(ids)
            else:
                end = bisect.bisect_right(planned.release_ns, now_ns, lo=start)
            ends = end >= len(ids)
            if end == start and not ends:
                continue
            logprobs = None if planned.logprobs is None else planned.logprobs[start:end]
            out.append((rid, ids[start:end], planned.finish if ends else None, logprobs))
            planned.sent = end
            if ends:
                ended.append(rid)
        for rid in ended:
            del running[rid]
        return out
