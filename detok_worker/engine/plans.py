"""The scheduler's data: a request as the engine tracks it, and one step's plan (a TokenBatch per worker, not
yet sent; detok_worker/engine/scheduler.py commits what was sent)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple

from detok_worker.bus.columns import token_batch
from detok_worker.bus.messages import (
    FINISH_LENGTH,
    FINISH_STOP,
    DetokParams,
    Open,
    Reject,
    RequestParams,
    TokenBatch,
    TokenLogprob,
    Tokens,
)
from detok_worker.engine.workers import WorkerRegistry
from detok_worker.stream.stop.rules import StopRules


@dataclass(slots=True)
class Request:
    rid: str
    prompt_tail: list[int]
    detok: DetokParams
    planned: list[int]  # every output id, already truncated to max_tokens (pushed: every id pushed so far)
    finish: str  # finish reason once `planned` is exhausted
    max_tokens: int = 0
    pushed: bool = False  # ids arrive by push(); a step emits every id pushed so far
    open_ended: bool = False  # pushed, and the engine has not ended it yet: more ids may come
    release_ns: list[int] | None = None  # replay at recorded speed: time at which each id may be emitted
    cursor: int = 0  # ids emitted (and committed) so far
    worker: str | None = None
    opened: bool = False  # the current worker has had its Open
    orphan_since: float | None = None
    ended: bool = False  # generation is over; kept (or re-opened) only until the front has the final text
    logprobs: list[TokenLogprob] | None = None  # aligned with planned, when the request asked for logprobs
    stop_chars: int = 0  # characters of its stop strings (its worker's worker.max_live_stop_chars)
    placed: bool = False  # it had a worker once: output may have reached its client (a re-open is never refused)

    def extend(self, ids: list[int], logprobs: list[TokenLogprob] | None) -> int:
        """Pushed ids (and their logprobs, when the request asked) up to max_tokens; returns the room there was."""
        room = self.max_tokens - len(self.planned)
        self.planned.extend(ids[:room])
        if self.logprobs is not None:
            self.logprobs += aligned_logprobs(logprobs, min(len(ids), room))
        return room

    def push(self, ids: list[int], finish: str | None, logprobs: list[TokenLogprob] | None) -> None:
        """The engine's new ids; `finish` ends it (ids past max_tokens are dropped and end it with "length")."""
        if len(ids) > self.extend(ids, logprobs):
            finish = FINISH_LENGTH
        if finish is not None:
            self.finish = finish
            self.open_ended = False

    def stop_at_cursor(self) -> None:
        """Its worker found a stop: a re-open must end where that worker ended, at the ids it had (its stop is found
        again in them)."""
        self.planned = self.planned[: self.cursor]
        if self.release_ns is not None:
            self.release_ns = self.release_ns[: self.cursor]
        self.finish = FINISH_STOP
        self.open_ended = False

    def step_end(self, tokens_per_step: int, now_ns: int) -> tuple[int, bool]:
        """(cursor after this step, whether the request ends with it): every id pushed so far of a pushed request;
        tokens_per_step of a planned one, or when it is paced (replay) every id whose time has come."""
        planned = self.planned
        if self.pushed:
            return len(planned), not self.open_ended
        if self.release_ns is None:
            end = min(self.cursor + tokens_per_step, len(planned))
        else:
            end = bisect.bisect_right(self.release_ns, now_ns, lo=self.cursor)
        return end, end >= len(planned)


def new_request(
    rid: str,
    tail: list[int],
    params: RequestParams,
    rules: StopRules,
    planned: list[int] | None,
    release_ns: list[int] | None = None,
    finish: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> Request:
    """A submitted request whose output ids are `planned` (cut to max_tokens; `finish` unless cut there, and
    `release_ns` pace them), or with None pushed as the engine makes them."""
    pushed = planned is None
    ids, end = ([], FINISH_LENGTH) if planned is None else plan_output(planned, params)
    if finish is not None and end != FINISH_LENGTH:
        end = finish
    request = Request(
        rid=rid,
        prompt_tail=tail,
        detok=rules.worker_params(),
        planned=[],
        finish=end,
        release_ns=release_ns[: len(ids)] if release_ns is not None else None,
        max_tokens=params.max_tokens,
        pushed=pushed,
        open_ended=pushed and params.max_tokens > 0,
        logprobs=None if params.sampling.logprobs is None else [],  # only when the request asked for them
        stop_chars=rules.stop_chars,
    )
    request.extend(ids, logprobs)  # ids are within max_tokens already
    return request


NO_LOGPROB = TokenLogprob(float("nan"))  # stands for an entry the engine did not give (the client sees null)


def aligned_logprobs(logprobs: list[TokenLogprob] | None, count: int) -> list[TokenLogprob]:
    """`count` entries: the engine's, padded with NO_LOGPROB where it gave fewer (so entries stay aligned with ids)."""
    given = list(logprobs or ())[:count]
    return given + [NO_LOGPROB] * (count - len(given))


def step_tokens(request: Request, cursor: int, end: int, ends: bool) -> Tokens:
    """The Tokens item of ids cursor..end (their logprobs too, when the request asked), with the finish if `ends`."""
    logprobs = request.logprobs
    return Tokens(
        request.rid,
        request.planned[cursor:end],
        request.finish if ends else None,
        None,
        None if logprobs is None else logprobs[cursor:end],
    )


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
    extra: list[Tokens]  # abort items queued for this worker


@dataclass(slots=True)
class StepPlan:
    workers: list[WorkerPlan]
    rejects: list[Reject]


class WorkerGroup(NamedTuple):
    """What one step sends one worker, gathered request by request (Scheduler.plan_step)."""

    opens: list[Open]
    items: list[Tokens]
    advances: list[Advance]

    @classmethod
    def empty(cls) -> WorkerGroup:
        return cls([], [], [])


Groups = dict[str, WorkerGroup]  # by worker


def worker_plans(
    step: int, sent_ns: int, groups: Groups, pending: dict[str, list[Tokens]], registry: WorkerRegistry
) -> list[WorkerPlan]:
    """One TokenBatch per worker with something to send: its abort items (`pending`), then its requests' `groups`."""
    for worker, extra in pending.items():
        if worker in registry and extra and worker not in groups:
            groups[worker] = WorkerGroup.empty()
    plans = []
    for worker, (opens, items, advances) in groups.items():
        extra = list(pending.get(worker, ()))
        batch = token_batch(step, sent_ns, opens, extra + items)
        plans.append(WorkerPlan(worker, batch, advances, extra))
    return plans


def plan_output(planned: list[int], params: RequestParams) -> tuple[list[int], str]:
    """Truncate a source's plan to max_tokens; the finish reason the request will end with."""
    if len(planned) > params.max_tokens:
        return planned[: params.max_tokens], FINISH_LENGTH
    return planned, FINISH_STOP


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
