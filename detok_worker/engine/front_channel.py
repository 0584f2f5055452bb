"""The engine's side of its connections to the front processes, a part of EngineLink (link.py).

`FrontChannel` takes Submit/Abort/Delivered/FrontHello/AdapterCall from the engine's PULL (Submits and adapter calls
become BusNews for the engine loop, Aborts and Delivered go to the Scheduler), and sends Rejects, PromptLogprobs,
AdapterAnswers and EngineStats to the
fronts' PUSH sockets; Rejects and PromptLogprobs wait in a bounded outbox while a front is stalled. With several
front processes (front.processes) it remembers each rid's Submit.front: the rid's Opens name it (the worker sends the
rid's text there) and the rid's Reject and PromptLogprobs go there; a FrontHello aborts the rids of that front index
(its earlier process died with their clients).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

from detok_worker.bus.codec import FrameDecoder, encode
from detok_worker.bus.messages import (
    Abort,
    AdapterAnswer,
    AdapterCall,
    Delivered,
    Finish,
    FrontHello,
    Open,
    PromptLogprobs,
    Reject,
    Submit,
    ToEngine,
)
from detok_worker.bus.sockets import recv_single_frame
from detok_worker.engine.scheduler import Scheduler
from detok_worker.trace.format import TraceWriter

log = logging.getLogger(__name__)

FRAMES_PER_WAKEUP = 1024
FRONT_OUTBOX_LIMIT = 100_000
BAD_UNEXPECTED = "unexpected"  # a valid message on the wrong socket (e.g. Hello at the front's PULL)
BAD_FRONT_INDEX = "front_index"  # a Submit/FrontHello naming a front index outside front.processes


@dataclass(slots=True)
class BusNews:
    """What happened on the bus since the last poll. A source takes `stopped` before `submitted`: a rid stopped in
    this poll and submitted again in it is a new request, which stopping the rid afterwards would end."""

    submitted: list[Submit] = field(default_factory=list)  # new requests, not yet accepted
    stopped: list[str] = field(default_factory=list)  # rids to stop generating (abort, worker Finish, reject)
    # those of them a worker ended, with its Finish; and the verdicts of rids with stop strings that the engine ended
    # (the worker says how they ended for the client: a stop string in their last ids, the ids kept)
    finishes: dict[str, Finish] = field(default_factory=dict)
    # of the stopped rids, those whose front had their final text before their worker's Finish came: they ended for
    # their client (the worker's Finish, on its way, says how)
    delivered: list[str] = field(default_factory=list)
    # LoRA adapters to load or unload (the engine source answers each: EngineLink.answer)
    adapter_calls: list[AdapterCall] = field(default_factory=list)


class FrontChannel:
    def __init__(
        self,
        pull: zmq.Socket[Any],
        pushes: list[zmq.Socket[Any]],
        scheduler: Scheduler,
        decoder: FrameDecoder[ToEngine],
        recorder: TraceWriter | None,
    ) -> None:
        self.pull = pull
        self.pushes = pushes  # by front index (front.processes)
        self.scheduler = scheduler
        self.decoder = decoder
        self.recorder = recorder
        # rid -> front index, for rids of fronts other than 0: set on their Opens, where their Rejects go
        self.rid_fronts: dict[str, int] = {}
        self.outbox: deque[tuple[int, bytes]] = deque()  # (front index, frame)

    def remember(self, rid: str, front: int) -> None:
        """An accepted request's Submit.front."""
        if front:
            self.rid_fronts[rid] = front

    def address_opens(self, opens: list[Open]) -> None:
        """Name each Open's front process (Open.front), where its worker sends the rid's text."""
        rid_fronts = self.rid_fronts
        if rid_fronts:
            for open_ in opens:
                open_.front = rid_fronts.get(open_.rid, 0)

    # ---- incoming ---------------------------------------------------------------------------------------

    def drain(self, news: BusNews) -> None:
        """Take what the fronts sent (up to FRAMES_PER_WAKEUP frames) into `news` and the Scheduler."""
        scheduler = self.scheduler
        for _ in range(FRAMES_PER_WAKEUP):
            try:
                frame = recv_single_frame(self.pull, self.decoder)
            except zmq.Again:
                return
            message = self.decoder.decode(frame) if frame is not None else None
            if isinstance(message, (Submit, FrontHello, AdapterCall)) and not 0 <= message.front < len(self.pushes):
                self.decoder.count_bad(BAD_FRONT_INDEX, message.front)  # no such front: nowhere to answer
            elif isinstance(message, Submit):
                news.submitted.append(message)
            elif isinstance(message, FrontHello):
                self._front_restarted(message, news)
            elif isinstance(message, AdapterCall):
                news.adapter_calls.append(message)
            elif isinstance(message, Abort):
                if self._abort(message.rid, news) and self.recorder is not None:
                    self.recorder.tokens(message.rid, [], message.reason)
            elif isinstance(message, Delivered):
                generating = scheduler.has_rid(message.rid, generating=True)
                if scheduler.delivered(message.rid) and generating:
                    # the front had the final text before the worker's Finish came here while the engine still generates
                    # the request: stop it there
                    news.stopped.append(message.rid)
                    news.delivered.append(message.rid)
            elif message is not None:
                self.decoder.count_bad(BAD_UNEXPECTED, type(message).__name__)

    def _front_restarted(self, hello: FrontHello, news: BusNews) -> None:
        """The requests of an earlier process at this front index lost their clients with it: abort them."""
        scheduler, rid_fronts = self.scheduler, self.rid_fronts
        rids = [rid for rid in scheduler.list_live_rids() if rid_fronts.get(rid, 0) == hello.front]
        rids += [submit.rid for submit in news.submitted if submit.front == hello.front]
        for rid in rids:
            self._abort(rid, news)
            self.rid_fronts.pop(rid, None)
        log.info(
            "engine: front %d (pid %d) is up; %d requests of its predecessor aborted", hello.front, hello.pid, len(rids)
        )

    def _abort(self, rid: str, news: BusNews) -> bool:
        """Abort a running request (True), or withdraw one submitted in the same poll, not accepted yet: it never
        starts."""
        if self.scheduler.abort(rid):
            news.stopped.append(rid)
            return True
        submitted = news.submitted
        for index, submit in enumerate(submitted):
            if submit.rid == rid:
                del submitted[index]
                self.scheduler.aborted += 1
                break
        return False

    # ---- to the fronts ------------------------------------------------------------------------------------

    def send(self, message: Reject | PromptLogprobs, front: int | None = None) -> None:
        """Queue a Reject or PromptLogprobs for the rid's front (`front` when given); `flush` sends what the fronts
        can take."""
        if front is None:
            front = self.rid_fronts.get(message.rid, 0) if self.rid_fronts else 0
        self.send_to(front, message)

    def send_to(self, front: int, message: Reject | PromptLogprobs | AdapterAnswer) -> None:
        if len(self.outbox) < FRONT_OUTBOX_LIMIT:
            self.outbox.append((front, encode(message)))

    def flush(self) -> None:
        while self.outbox:
            front, frame = self.outbox[0]
            try:
                self.pushes[front].send(frame, zmq.NOBLOCK)
            except zmq.Again:
                return
            self.outbox.popleft()

    def broadcast(self, frame: bytes) -> None:
        """A periodic frame (EngineStats) to every front; dropped where a queue is full (the next one will do)."""
        for push in self.pushes:
            with contextlib.suppress(zmq.Again):
                push.send(frame, zmq.NOBLOCK)

    def forget_ended(self) -> None:
        """Forget the fronts of rids the engine no longer holds (an ended rid may still be re-opened)."""
        if self.rid_fronts:
            known, ended = self.scheduler.has_rid, self.scheduler.delivering
            self.rid_fronts = {rid: front for rid, front in self.rid_fronts.items() if known(rid) or rid in ended}
