"""Bad parameters and engine-side errors through the whole path, with `detok front`, `detok worker` and `detok
engine` as separate processes in one runtime dir (the Procfile way), the worker configured with smaller stop
limits than the front (as on another host with its own config):

- NaN/huge numbers, stop lists beyond the front's limits, ids outside the vocabulary, invalid UTF-8: a 400 before
  anything reaches the bus;
- stop strings that pass the front but break the worker's limits end the request with a clear error (502, or an
  error event in a stream), counted in the worker's bad_frames and logged once per request with its rid;
- text of ids that are not valid UTF-8 on their own is exactly what decode() gives (U+FFFD);
- then the engine is replaced by a test-played one that ends a request with finish "error" mid-stream: the
  client gets the text so far and an error, and the rid is freed in the worker and the front within 1 s."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zmq
from helpers.bus_peers import bus_config, short_runtime_dir
from helpers.front_harness import free_port
from helpers.role_process import RoleProcess, stopping
from helpers.serve_helpers import wait_for

from detok_worker.bus.codec import encode, engine_decoder
from detok_worker.bus.columns import token_batch
from detok_worker.bus.messages import DetokParams, EngineStats, Heartbeat, Open, Submit, Tokens
from detok_worker.bus.sockets import BusSockets

WORKER = "small-limits"
STATS_INTERVAL_S = 0.05
FREED_WITHIN_S = 1.0 + STATS_INTERVAL_S


class PlayedEngine(threading.Thread):
    """Binds the engine's endpoints: answers each Submit with the first ids of its prompt and then ends it with
    finish "error", as an engine that failed mid-generation; reports EngineStats so the front takes requests."""

    def __init__(self, runtime_dir: str) -> None:
        super().__init__(daemon=True)
        self.config = bus_config(runtime_dir)
        self.stop_event = threading.Event()
        self.worker: bytes | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        decoder = engine_decoder()
        with BusSockets(self.config) as bus:
            pull, router, push = bus.engine_pull(), bus.worker_router(), bus.front_push()
            self.ready.set()
            poller = zmq.Poller()
            poller.register(pull, zmq.POLLIN)
            poller.register(router, zmq.POLLIN)
            step = 0
            while not self.stop_event.is_set():
                events = dict(poller.poll(STATS_INTERVAL_S * 1000))
                if router in events:
                    identity, frame = router.recv_multipart()
                    if isinstance(decoder.decode(frame), Heartbeat):
                        self.worker = identity
                if pull in events and self.worker is not None:
                    submit = decoder.decode(pull.recv())
                    if isinstance(submit, Submit):
                        step += 1
                        opens = [Open(submit.rid, [], DetokParams())]
                        first = token_batch(step, time.time_ns(), opens, [(submit.rid, Tokens(submit.prompt_ids[:3]))])
                        last = token_batch(step + 1, time.time_ns(), [], [(submit.rid, Tokens([], "error"))])
                        router.send_multipart([self.worker, encode(first)])
                        router.send_multipart([self.worker, encode(last)])
                workers = {self.worker.decode(): 0} if self.worker is not None else {}
                push.send(encode(EngineStats(0, workers, {}, 0, 0)), zmq.NOBLOCK)


@pytest.fixture(scope="module")
def processes() -> Iterator[dict[str, Any]]:
    with short_runtime_dir("dtp-") as runtime_dir:
        port = free_port()
        fast_stats = ["--set", f"worker.stats_interval_s={STATS_INTERVAL_S}"]
        started = {
            "front": RoleProcess(runtime_dir, "front", "--set", f"front.port={port}"),
            "worker": RoleProcess(
                runtime_dir,
                "worker",
                "--id",
                WORKER,
                *fast_stats,
                "--set",
                "worker.max_stop_strings=2",
                "--set",
                "worker.max_stop_string_chars=8",
            ),  # fmt: skip
            "engine": RoleProcess(
                runtime_dir,
                "engine",
                "--source",
                "echo",
                "--step-interval-ms",
                "2",
                "--set",
                f"engine.stats_interval_s={STATS_INTERVAL_S}",
            ),  # fmt: skip
        }
        url = f"http://127.0.0.1:{port}"
        with stopping(started):
            wait_for(lambda: _health(url) == 200, 60, what="the front to see the engine and the worker")
            yield {"url": url, "runtime_dir": runtime_dir, **started}


def _health(url: str) -> int:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/stats", timeout=5).json()


def _worker_bad(url: str, kind: str) -> int:
    worker = _stats(url)["workers"].get(WORKER)
    return worker["bad_frames"].get(kind, 0) if worker else -1


def _idle(url: str) -> bool:
    stats = _stats(url)
    workers = [worker["live_rids"] for worker in stats["workers"].values()]
    return stats["front"]["live_rids"] == 0 and workers == [0] and (stats["engine"] or {}).get("live_rids", 0) == 0


def test_stop_strings_beyond_the_worker_limits_end_with_a_clear_error(processes: dict[str, Any]) -> None:
    url = processes["url"]
    wait_for(lambda: _worker_bad(url, "bad_params") >= 0, 10, what="the worker's first stats at the front")
    bad_before = _worker_bad(url, "bad_params")  # -1 (no stats yet) would make the count below unreachable
    cases = [
        ({"stop": ["a", "b", "c", "d", "e"]}, "at most 2 stop strings are allowed (got 5)"),
        ({"stop": ["twenty characters!!!"]}, "a stop string is longer than 8 characters"),
    ]
    for index, (extra, message) in enumerate(cases * 3):
        body = {"prompt": "Hello there, how are you?", "max_tokens": 50, **extra}
        headers = {"X-Request-Id": f"params-{index}"}
        response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)
        assert response.status_code == 502 and message in response.json()["error"]["message"], response.text
        streamed = {**body, "stream": True}
        headers = {"X-Request-Id": f"params-{index}-stream"}
        with httpx.stream("POST", f"{url}/v1/completions", json=streamed, headers=headers, timeout=30) as reply:
            lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and message in lines[-2]
    wait_for(lambda: _worker_bad(url, "bad_params") == bad_before + 12, 5, what="12 bad_params counted")
    wait_for(lambda: _idle(url), FREED_WITHIN_S + 1, what="live rids 0 everywhere")
    # one line per refused request, naming its rid, which holds the client's X-Request-Id
    refused = re.findall(r"rid (cmpl-[\w-]+) failed \(bad_params", processes["worker"].log())
    assert len(refused) == len(set(refused)) == 12
    request_ids = {f"cmpl-params-{index}{kind}" for index in range(6) for kind in ("", "-stream")}
    assert {rid.rsplit("-", 1)[0] for rid in refused} == request_ids
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "still fine", "stop": ["!"]}, timeout=30)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "still fine"


def test_bad_numbers_and_limits_are_400_and_never_reach_the_bus(processes: dict[str, Any]) -> None:
    url = processes["url"]
    submitted = _stats(url)["front"].get("requests", 0)
    bodies = [
        b'{"prompt": "x", "temperature": NaN}',
        b'{"prompt": "x", "top_p": 1e999}',
        b'{"prompt": "x", "max_tokens": 100000000000000000000000}',
        b'{"prompt": "x", "max_tokens": -1}',
        b'{"prompt": "x", "seed": 1e400}',
        json.dumps({"prompt": "x", "stop": [f"s{i}" for i in range(65)]}).encode(),  # front limit: 64
        json.dumps({"prompt": "x", "stop": ["y" * 1025]}).encode(),  # front limit: 1024 characters
        json.dumps({"prompt": "x", "stop_token_ids": [-1]}).encode(),
        json.dumps({"prompt": [151669]}).encode(),  # outside the vocabulary
        b'{"prompt": "\xff\xfe not UTF-8"}',
    ]
    for body in bodies:
        response = httpx.post(f"{url}/v1/completions", content=body, timeout=30)
        assert response.status_code == 400, (body[:60], response.text)
        assert response.json()["error"]["message"]
    assert _stats(url)["front"].get("requests", 0) == submitted


def test_ids_that_are_not_utf8_on_their_own_decode_like_decode(processes: dict[str, Any], tokenizer: Any) -> None:
    emoji = tokenizer.encode("🫠").ids  # three byte-level tokens, none a whole character
    assert len(emoji) == 3
    before, after = tokenizer.encode("a").ids, tokenizer.encode(" b.").ids  # the prompt (= the output) ends cleanly
    for broken in (emoji[:1], emoji[-1:], [*emoji[-1:], *emoji[:1]], [*emoji, *emoji[:1]], emoji[1:] * 2):
        ids = [*before, *broken, *after]
        body = {"prompt": ids, "max_tokens": 10}
        response = httpx.post(f"{processes['url']}/v1/completions", json=body, timeout=30)
        assert response.status_code == 200
        assert response.json()["choices"][0]["text"] == tokenizer.decode(ids), ids


def test_engine_side_error_mid_stream_frees_the_rid(processes: dict[str, Any], tokenizer: Any) -> None:
    url = processes["url"]
    assert processes["engine"].stop() == 0  # the real engine leaves; a played one takes its endpoints
    played = PlayedEngine(processes["runtime_dir"])
    played.start()
    try:
        wait_for(lambda: played.worker is not None and _health(url) == 200, 20, what="the played engine in use")
        prompt = "Partial text, then the engine fails."
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={"prompt": prompt, "stream": True}, timeout=30
        ) as reply:
            lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
        ended_at = time.monotonic()
        assert lines[-1] == "data: [DONE]"
        # the engine's failure (the worker's final delta says so), not the detokenizer's
        assert '"service_unavailable"' in lines[-2] and "the engine ended the request with an error" in lines[-2]
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids
        streamed = "".join(line.split('"text":"', 1)[1].split('"', 1)[0] for line in lines[:-2])
        assert streamed == tokenizer.decode(ids[:3])
        response = httpx.post(f"{url}/v1/completions", json={"prompt": prompt}, timeout=30)
        assert response.status_code == 503 and response.json()["error"]["type"] == "service_unavailable", response.text
        wait_for(lambda: _idle(url), ended_at + FREED_WITHIN_S + 0.5 - time.monotonic(), what="the rid freed")
    finally:
        played.stop_event.set()
        played.join(5)
