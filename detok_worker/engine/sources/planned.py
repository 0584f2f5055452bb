"""The planning sources: for a submitted request, every output id the local engine will "generate", at once.

- corpus: the tokens of one passage of the text corpus (chosen per rid by a seeded RNG), then EOS; the ids of
  every passage are encoded at start, or read from their disk cache (corpus_ids.py);
- echo: the prompt's own ids, then EOS (a client can predict the exact output);
- trace: the output ids of a recorded trace's requests, round robin, paced as recorded (engine.replay_speed;
  0 = as fast as the engine steps).
(llama-cpp, a real model, generates step by step instead: llama.py.) The scheduler truncates a plan to
max_tokens; EOS at the end survives only if it fits.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from detok_worker.bus.messages import RequestParams
from detok_worker.engine.sources.base import Plan, SourceError
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import Trace

PASSAGE_SEPARATOR = "%%"  # a line of its own between passages of a corpus file


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
            root = resources.files("detok_worker.engine.sources") / "corpus"
            entries = sorted((e for e in root.iterdir() if e.name.endswith(".txt")), key=lambda e: e.name)
            texts = [entry.read_text(encoding="utf-8") for entry in entries]
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read corpus {directory or '(shipped)'}: {exc}") from exc
    passages = [passage for text in texts for passage in split_passages(text)]
    if not passages:
        raise SourceError(f"corpus {directory or '(shipped)'} holds no passages (*.txt files separated by %%)")
    return passages


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
        """`passage_ids`: every passage's ids, known beforehand (corpus_ids.py); else each passage is
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
