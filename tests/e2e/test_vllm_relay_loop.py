"""The vLLM source's two tasks on one loop, in vLLM's interpreter: a relay behind its engine core (vLLM's client has
steps queued, and hands each out without suspending) sends the queued steps on in groups of MAX_COALESCED_STEPS
(one TokenBatch per worker for the group), and must still take the bus's news between groups: a Submit that arrives
then starts after the group, not once the relay has caught up (until then no request would start, no abort or
worker heartbeat would be read, and the engine would declare its live workers lost)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from helpers.serve_helpers import REPO
from helpers.vllm_cpu import ENV, require_venv

pytestmark = pytest.mark.timeout(300)


def run_in_vllm(script: str) -> dict[str, Any]:
    """Run `script` in vLLM's interpreter; the JSON object it prints last."""
    result = subprocess.run(
        [str(require_venv()), "-c", script],
        capture_output=True, text=True, env=dict(os.environ, **ENV, PYTHONPATH=str(REPO)), timeout=240, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


BEHIND_SCRIPT = """
import asyncio, json, tempfile, time
import zmq
from vllm.v1.engine import EngineCoreOutputs
from detok_worker.bus.codec import encode
from detok_worker.bus.messages import RequestParams, Submit
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import load_config
from detok_worker.engine.link import EngineLink
from detok_worker.engine.sources.vllm_source import MAX_COALESCED_STEPS, VllmSource

BACKLOG = 300  # the steps the engine core is ahead
SUBMIT_AT = 10  # the step at which a client's request comes

config = load_config(None, {"bus.runtime_dir": tempfile.mkdtemp(prefix="dt-", dir="/tmp")})
front = BusSockets(config)
to_engine = front.engine_push()
link = EngineLink(config)
seen = {"max_coalesced": MAX_COALESCED_STEPS, "sent_at": []}


class Queued:
    def qsize(self):
        return max(BACKLOG - client.steps, 0)


class BehindClient:
    steps = 0
    outputs_queue = Queued()

    async def get_output_async(self):
        self.steps += 1
        if self.steps == SUBMIT_AT:
            to_engine.send(encode(Submit("late", [1, 2], RequestParams(max_tokens=4))))
            deadline = time.monotonic() + 30
            while not link.fronts.pull.getsockopt(zmq.EVENTS) & zmq.POLLIN and time.monotonic() < deadline:
                time.sleep(0.001)  # the frame is on its way: wait here, as a busy relay would, without suspending
            seen["arrived"] = self.steps
        if self.steps > BACKLOG:
            await asyncio.sleep(3600)  # caught up: nothing queued
        return EngineCoreOutputs(outputs=[])


class Adapters:
    def paths(self):
        return {}


class Source(VllmSource):
    async def _start(self, submit):
        seen["taken"] = self.client.steps
        self.stopping = True

    async def _watch_engine_connections(self):
        await asyncio.Event().wait()


def step():  # the engine step (client.steps) at which each group of steps goes to the workers
    seen["sent_at"].append(client.steps)
    return 0


link.step = step
client = BehindClient()
source = Source(link, client, None, Adapters())
asyncio.run(asyncio.wait_for(source.run(), 60))
link.close()
front.close()
print(json.dumps(seen))
"""


def test_a_relay_behind_its_engine_core_sends_queued_steps_in_groups_and_takes_a_submit_after_its_group() -> None:
    seen = run_in_vllm(BEHIND_SCRIPT)
    group = seen["max_coalesced"]
    assert group > 1, seen
    # the queued steps go on in full groups (one TokenBatch per worker for each), not one by one
    assert seen["sent_at"][:2] == [group, 2 * group], seen
    assert seen["arrived"] == 10, seen
    assert seen["taken"] - seen["arrived"] <= group, seen  # after its group, not at the end of the 300 queued steps


DEATH_SCRIPT = """
import asyncio, json, os, tempfile, time
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.engine.exceptions import EngineDeadError
from detok_worker.bus.codec import encode, worker_decoder
from detok_worker.bus.messages import Hello, RequestParams, Submit, TokenBatch
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import load_config
from detok_worker.engine.link import EngineLink
from detok_worker.engine.sources.vllm_source import VllmSource

config = load_config(None, {"bus.runtime_dir": tempfile.mkdtemp(prefix="dt-", dir="/tmp")})
link = EngineLink(config)
worker = BusSockets(config).worker_dealer("w0")
worker.send(encode(Hello("w0", os.getpid())))
deadline = time.monotonic() + 30
while not link.scheduler.live_workers() and time.monotonic() < deadline:
    link.poll(100)
for rid in ("done", "open", "failed"):
    assert link.accept(Submit(rid, [1, 2], RequestParams(max_tokens=8))) is not None
link.step()

# two steps queued at once, then the engine core's death: "done" finished in the second step, "failed" ended there
# with the engine core's error, "open" was running
steps = [
    EngineCoreOutputs(outputs=[EngineCoreOutput("done", [5]), EngineCoreOutput("open", [6]),
                               EngineCoreOutput("failed", [9])]),
    EngineCoreOutputs(outputs=[EngineCoreOutput("done", [7], finish_reason=FinishReason.LENGTH),
                               EngineCoreOutput("open", [8]),
                               EngineCoreOutput("failed", [], finish_reason=FinishReason.ERROR)]),
]


class Queued:
    def qsize(self):
        return len(steps) + 1  # the steps, then the death


class DyingClient:
    outputs_queue = Queued()

    async def get_output_async(self):
        if steps:
            return steps.pop(0)
        raise EngineDeadError()


class Adapters:
    def paths(self):
        return {}


source = VllmSource(link, DyingClient(), None, Adapters())
source.on_engine.update(("done", "open", "failed"))
asyncio.run(asyncio.wait_for(source._read_outputs(), 30))
decoder = worker_decoder()
rows = {}
while worker.poll(1000):
    message = decoder.decode(worker.recv())
    if isinstance(message, TokenBatch):
        for index, rid in enumerate(message.rids):
            extra = message.extras.get(index)
            ids = extra.ids if extra is not None else [message.ids[index]]
            finish = extra.finish if extra is not None else None
            entry = rows.setdefault(rid, {"ids": [], "finish": None})
            entry["ids"] += ids
            entry["finish"] = finish or entry["finish"]
link.close()
print(json.dumps(rows))
"""


def test_the_steps_held_when_the_engine_core_dies_reach_the_workers_before_its_error() -> None:
    """Steps held for one batch and then the engine core's death: a request the engine core finished in them ends
    whole ("length", every id), one it ended with an error and a running one get their ids, then the error."""
    rows = run_in_vllm(DEATH_SCRIPT)
    assert rows["done"] == {"ids": [5, 7], "finish": "length"}, rows
    assert rows["open"] == {"ids": [6, 8], "finish": "error"}, rows
    assert rows["failed"] == {"ids": [9], "finish": "error"}, rows
