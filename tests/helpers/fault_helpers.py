"""Helpers of the fault tests (tests/faults/): an SSE/JSON load client over HTTP with a deadline on
every request, reference texts of the echo source computed without detok's own stream code, live rid counts and
RSS of the processes of a `detok serve` run."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engine_stub.planned import load_corpus, primary_eos_id
from helpers.serve_helpers import ServeProcess, serving, wait_for

REQUEST_TIMEOUT_S = 60.0  # no request may hang: every one has this deadline (generous for a loaded 2-core box)


@dataclass
class Outcome:
    """What a client saw for one request."""

    status: int
    text: str = ""
    finish_reason: str | None = None
    error: dict[str, Any] | None = None
    completion_tokens: int | None = None
    done: bool = False  # the stream ended with data: [DONE]
    error_at: float | None = None  # time.monotonic() when the error event arrived
    token_ids: list[int] | None = None  # with return_token_ids: the concatenated chunks' output ids


@dataclass(frozen=True)
class EchoCase:
    """A /v1/completions request with token-id prompt: the echo source generates `ids` then EOS."""

    ids: list[int]
    stop: list[str]
    max_tokens: int

    def body(self, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": self.ids, "max_tokens": self.max_tokens, "stream": stream}
        if self.stop:
            body["stop"] = self.stop
        return body


def reference(tokenizer: Any, case: EchoCase) -> tuple[str, str]:
    """(text, finish_reason) a client must get: the decode of the generated ids (the prompt's ids, then EOS, cut
    at max_tokens; the EOS is a hidden stop token) truncated before the first stop string match (the match that
    ends first; ties: the one that starts first)."""
    generated = [*case.ids, primary_eos_id(tokenizer)][: case.max_tokens]
    eos_ids = set(tokenizer.eos_token_ids)
    cut = next((i for i, token_id in enumerate(generated) if token_id in eos_ids), None)
    text = tokenizer.decode(generated[:cut] if cut is not None else generated, skip_special_tokens=True)
    finish = "stop" if cut is not None else "length"
    matches = [(text.find(s) + len(s), text.find(s)) for s in case.stop if s in text]
    if matches:
        return text[: min(matches)[1]], "stop"
    return text, finish


def echo_cases(
    tokenizer: Any, count: int, seed: int, *, min_tokens: int = 40, stop_share: float = 0.7
) -> list[EchoCase]:
    """Requests over the multilingual corpus (emoji, CJK, code: characters split across tokens). Most have a stop
    string taken from their own text at a random place (so it hits mid-stream, often across tokens), some a stop
    string that never matches; a few end by max_tokens."""
    rng = random.Random(seed)
    passages = load_corpus()
    cases = []
    for _ in range(count):
        ids: list[int] = []
        while len(ids) < min_tokens:
            ids += tokenizer.encode(rng.choice(passages) + "\n").ids
        text = tokenizer.decode(ids)
        stop: list[str] = []
        if rng.random() < stop_share:
            start = rng.randrange(len(text) // 3, len(text) - 4)
            candidate = text[start : start + rng.randint(2, 6)]
            if candidate.strip():
                stop.append(candidate)
        if rng.random() < 0.2:
            stop.append("§never§")
        max_tokens = rng.randint(5, len(ids)) if rng.random() < 0.1 else len(ids) + 10
        cases.append(EchoCase(ids, stop, max_tokens))
    return cases


def http_client(service: ServeProcess, connections: int = 256, timeout: float = REQUEST_TIMEOUT_S) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(base_url=service.url, timeout=timeout, limits=limits)


async def stream_completion(
    client: httpx.AsyncClient, body: dict[str, Any], arrivals: list[float] | None = None
) -> Outcome:
    """POST /v1/completions with stream: the concatenated text, finish_reason, an error event if one came, and the
    usage's completion_tokens if the stream carried usage. `arrivals` gets the time.monotonic() of every event that
    carried text."""
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        if response.status_code != 200:
            return Outcome(response.status_code, error=json.loads(await response.aread())["error"])
        outcome = Outcome(200)
        parts: list[str] = []
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                outcome.done = True
                break
            event = json.loads(data)
            if "error" in event:
                outcome.error = event["error"]
                outcome.error_at = time.monotonic()
                continue
            if event.get("usage"):  # stream_options include_usage
                outcome.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event["choices"]:
                parts.append(choice["text"])
                if "token_ids" in choice:
                    outcome.token_ids = (outcome.token_ids or []) + choice["token_ids"]
                if arrivals is not None and choice["text"]:
                    arrivals.append(time.monotonic())
                outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
        outcome.text = "".join(parts)
        return outcome


async def complete(client: httpx.AsyncClient, body: dict[str, Any]) -> Outcome:
    """POST /v1/completions without streaming."""
    response = await client.post("/v1/completions", json={**body, "stream": False})
    payload = response.json()
    if response.status_code != 200:
        return Outcome(response.status_code, error=payload["error"])
    choice = payload["choices"][0]
    return Outcome(200, choice["text"], choice["finish_reason"], None, payload["usage"]["completion_tokens"])


async def bounded(coroutine: Any, timeout: float = REQUEST_TIMEOUT_S) -> Any:
    """A request that does not end within `timeout` fails the test (as asyncio.TimeoutError): none may hang."""
    return await asyncio.wait_for(coroutine, timeout)


def live_counts(service: ServeProcess) -> dict[str, int]:
    """Live rids of the front, the engine and every worker (summed), from /stats."""
    stats = service.stats()
    return {
        "front": stats["front"]["live_rids"],
        "engine": stats["engine"]["live_rids"] if stats["engine"] else -1,
        "workers": sum(worker["live_rids"] for worker in stats["workers"].values()),
    }


def all_idle(service: ServeProcess) -> bool:
    return all(count == 0 for count in live_counts(service).values())


def fresh_engine_stats(service: ServeProcess) -> dict[str, Any]:
    """The engine's /stats section once it is at most 0.2 s old (a front that was frozen has caught up)."""
    return wait_for(lambda: (e := service.stats()["engine"]) and e["age_s"] < 0.2 and e, 5, what="fresh stats")


def rss_kb(pid: int) -> int:
    """Resident set size of a process (VmRSS, KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def service_pids(service: ServeProcess) -> dict[str, int]:
    """Role name -> pid of every child of a `detok serve` run (workers as worker:<pid>)."""
    pids = {}
    for role in ("front", "engine"):
        (pid,) = service.child_pids(role)
        pids[role] = pid
    for pid in service.child_pids("worker"):
        pids[f"worker:{pid}"] = pid
    return pids


def echo_service(workers: int, step_ms: float | str, *extra: str) -> AbstractContextManager[ServeProcess]:
    """`serving` a `detok serve` on the echo source (the test knows every output id) whose engine and workers report
    stats every 0.1 s, so /stats follows live counts closely; `extra` are more CLI flags."""
    return serving(
        "--workers", str(workers), "--source", "echo", "--step-interval-ms", str(step_ms), *extra,
        "--set", "worker.stats_interval_s=0.1", "--set", "engine.stats_interval_s=0.1",
    )  # fmt: skip


def stalled_stream(service: ServeProcess, body: dict[str, Any]) -> socket.socket:
    """POST /v1/completions on a raw socket with a tiny receive buffer, then (until the caller reads) no reading:
    the kernel buffers fill up and the front has to hold the rest of the output."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", int(service.url.rsplit(":", 1)[1])))
    payload = json.dumps(body).encode()
    raw.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return raw


def read_sse_events(raw: socket.socket, timeout: float = 10.0) -> list[bytes]:
    """Read a stalled stream to its end; its SSE data payloads (one event per HTTP chunk, so data lines are whole
    between the chunk-size lines)."""
    raw.settimeout(timeout)
    received = b""
    while not received.endswith(b"0\r\n\r\n"):
        chunk = raw.recv(1 << 20)
        if not chunk:
            break
        received += chunk
    return [line[len(b"data: ") :].strip() for line in received.split(b"\n") if line.startswith(b"data: ")]
