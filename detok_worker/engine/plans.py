"""The scheduler's data: what a Submit may ask (`SubmitLimits`), a request as the engine tracks it (the ids its engine
pushed), one step's plan (a TokenBatch per worker, not yet sent; `Scheduler.commit` takes what was sent), and the
ended requests kept until the front has their final text (`Undelivered`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from detok_worker.bus.columns import TokenRow, token_batch
from detok_worker.bus.messages import (
    FINISH_LENGTH,
    FINISH_STOP,
    MAX_TOP_LOGPROBS,
    DetokParams,
    Open,
    Reject,
    RequestParams,
    TokenBatch,
    TokenLogprob,
)
from detok_worker.config import DetokConfig
from detok_worker.config.schema import PROMPT_TOKENS_CAP
from detok_worker.engine.workers import WorkerRegistry
from detok_worker.stream.stop.rules import StopRules


@dataclass(frozen=True, slots=True)
class SubmitLimits:
    """What the engine accepts in a Submit, checked again at the engine: any same-uid bus peer can send one without
    the front's validation (max_tokens 2**40, a prompt of millions of ids, a billion logprobs per token)."""

    max_tokens: int
    max_prompt_tokens: int

    @classmethod
    def from_config(cls, config: DetokConfig) -> SubmitLimits:
        """The front's limits: front.max_tokens_limit, and front.max_prompt_tokens (or the cap when it is 0, as
        the engine does not know the tokenizer's model_max_length)."""
        front = config.front
        return cls(front.max_tokens_limit, front.max_prompt_tokens or PROMPT_TOKENS_CAP)

    def check(self, prompt_ids: list[int], params: RequestParams) -> str | None:
        """Why the engine refuses this request, or None."""
        if not 0 <= params.max_tokens <= self.max_tokens:
            return f"max_tokens must be between 0 and {self.max_tokens}, got {params.max_tokens}"
        if len(prompt_ids) > self.max_prompt_tokens:
            return f"the prompt has {len(prompt_ids)} tokens; at most {self.max_prompt_tokens} are allowed"
        top = params.sampling.logprobs
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            return f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}"
        return None


NO_SUBMIT_LIMITS = SubmitLimits(2**62, 2**62)


@dataclass(slots=True)
class Request:
    rid: str
    prompt_tail: list[int]
    detok: DetokParams
    ids: list[int]  # every output id the engine pushed so far (up to max_tokens)
    finish: str  # finish reason once the engine ended it
    max_tokens: int = 0
    open_ended: bool = False  # the engine has not ended it yet: more ids may come
    cursor: int = 0  # ids emitted (and committed) so far
    worker: str | None = None
    opened: bool = False  # the current worker has had its Open
    orphan_since: float | None = None
    ended: bool = False  # generation is over; kept (or re-opened) only until the front has the final text
    logprobs: list[TokenLogprob] | None = None  # aligned with ids, when the request asked for logprobs
    stop_chars: int = 0  # characters of its stop strings (its worker's worker.max_live_stop_chars)
    placed: bool = False  # it had a worker once: output may have reached its client (a re-open is never refused)
    workers_lost: int = 0  # workers lost while they held it (a Goodbye is no loss)

    def stop_at_cursor(self) -> None:
        """Its worker found a stop: a re-open must end where that worker ended, at the ids it had (its stop is found
        again in them)."""
        del self.ids[self.cursor :]
        self.finish = FINISH_STOP
        self.open_ended = False


def new_request(rid: str, tail: list[int], params: RequestParams, rules: StopRules) -> Request:
    """A submitted request, its ids to come by push (max_tokens 0: ended already, with "length")."""
    return Request(
        rid=rid,
        prompt_tail=tail,
        detok=rules.worker_params(),
        ids=[],
        finish=FINISH_LENGTH,
        max_tokens=params.max_tokens,
        open_ended=params.max_tokens > 0,
        logprobs=None if params.sampling.logprobs is None else [],  # only when the request asked for them
        stop_chars=rules.stop_chars,
    )


NO_LOGPROB = TokenLogprob(float("nan"))  # stands for an entry the engine did not give (the client sees null)


def aligned_logprobs(logprobs: list[TokenLogprob] | None, count: int) -> list[TokenLogprob]:
    """`count` entries: the engine's, padded with NO_LOGPROB where it gave fewer (so entries stay aligned with ids)."""
    given = list(logprobs or ())[:count]
    return given + [NO_LOGPROB] * (count - len(given))


@dataclass(slots=True)
class Emitted:
    """Ids newly emitted for one rid in a committed batch (history re-sent on a re-open is not included)."""

    rid: str
    ids: list[int]
    finish: str | None


Advance = tuple[Request, int, bool]  # (request, cursor after this batch, ends now); one per request per step


@dataclass(slots=True)
class WorkerPlan:
    worker: str
    batch: TokenBatch
    advances: list[Advance]
    extra: list[TokenRow]  # abort rows queued for this worker


@dataclass(slots=True)
class StepPlan:
    workers: list[WorkerPlan]
    rejects: list[Reject]


class WorkerGroup(NamedTuple):
    """What one step sends one worker, gathered request by request (Scheduler.plan_step)."""

    opens: list[Open]
    rows: list[TokenRow]
    advances: list[Advance]


Groups = dict[str, WorkerGroup]  # by worker


def worker_plans(
    step: int, sent_ns: int, groups: Groups, pending: dict[str, list[TokenRow]], registry: WorkerRegistry
) -> list[WorkerPlan]:
    """One TokenBatch per worker with something to send: its abort rows (`pending`), then its requests' `groups`."""
    for worker, extra in pending.items():
        if worker in registry and extra and worker not in groups:
            groups[worker] = WorkerGroup([], [], [])
    plans = []
    for worker, (opens, rows, advances) in groups.items():
        extra = list(pending.get(worker, ()))
        batch = token_batch(step, sent_ns, opens, extra + rows)
        plans.append(WorkerPlan(worker, batch, advances, extra))
    return plans


PROMPT_TAIL = 64  # prompt ids sent with Open: context for the first output characters (a byte-fallback run too)
PROMPT_CONTEXT = 8  # ids other than special tokens the tail holds at least, however many specials end the prompt
MAX_PROMPT_TAIL = 4096  # ... up to this many ids in all


def prompt_tail(prompt_ids: list[int], special_ids: frozenset[int]) -> list[int]:
    """The end of the prompt a worker decodes the output after: the last PROMPT_TAIL ids, reaching further back past
    special tokens (skip_special_tokens drops them) until PROMPT_CONTEXT other ids are in, at most MAX_PROMPT_TAIL:
    a character the prompt leaves unfinished before a run of specials still belongs to the prompt."""
    start = max(0, len(prompt_ids) - PROMPT_TAIL)
    if special_ids:
        others = 0
        floor = max(0, len(prompt_ids) - MAX_PROMPT_TAIL)
        position = len(prompt_ids)
        while position > floor and others < PROMPT_CONTEXT:
            position -= 1
            others += prompt_ids[position] not in special_ids
        start = min(start, position)
    return list(prompt_ids[start:])


R = TypeVar("R")


class Undelivered(Generic[R]):
    """Requests whose generation ended but whose final text the front has not confirmed yet (`Delivered`): rid ->
    (request, worker, ended at), oldest first; plus the rids of each worker.

    The last ids of a request (or the ids in which its worker found a stop) may still sit in that worker's queues
    when it dies; the engine then re-opens the request with its whole history. So an ended request is kept here,
    under the worker that ended it, until the front confirms, or for `grace_s` at most: a front that never sends
    Delivered (a collector that only listens) costs memory for that long, nothing more."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._entries: dict[str, tuple[R, str, float]] = {}
        self._by_worker: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: str) -> bool:
        return rid in self._entries

    def rids(self, worker: str | None = None) -> set[str]:
        return set(self._entries) if worker is None else set(self._by_worker.get(worker, ()))

    def hold(self, rid: str, request: R, worker: str, now: float) -> None:
        self.forget(rid)
        self._entries[rid] = (request, worker, now)
        self._by_worker.setdefault(worker, set()).add(rid)

    def forget(self, rid: str) -> bool:
        entry = self._entries.pop(rid, None)
        if entry is None:
            return False
        worker = entry[1]
        rids = self._by_worker[worker]
        rids.discard(rid)
        if not rids:
            del self._by_worker[worker]
        return True

    def take_worker(self, worker: str) -> list[R]:
        """The worker is lost: its ended requests, no longer held here (the caller re-opens them)."""
        return [self._entries.pop(rid)[0] for rid in self._by_worker.pop(worker, ())]

    def expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            rid, (_, _, ended_at) = next(iter(entries.items()))
            if now - ended_at <= self.grace_s:
                return
            self.forget(rid)
