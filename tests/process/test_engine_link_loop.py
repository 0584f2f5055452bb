"""The engine loop of docs/protocol.md (section 5), run exactly as printed there, with a generator engine that
pushes ids as it makes them, two real worker processes and a played front over real sockets."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

from helpers.bus_peers import bus_config, short_runtime_dir, start_process, stop_process
from helpers.fixtures import REPO

from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.messages import DetokParams, RequestParams
from detok_worker.worker.process import run_worker
from engine_stub.generators import GeneratorEngine
from engine_stub.planned import load_corpus, primary_eos_id

LOOP_BLOCK = re.compile(r"<!-- engine-loop:start -->\n```python\n(.*?)```\n<!-- engine-loop:end -->", re.S)


def documented_loop() -> Any:
    match = LOOP_BLOCK.search((REPO / "docs" / "protocol.md").read_text(encoding="utf-8"))
    assert match is not None, "docs/protocol.md lost its engine-loop example"
    namespace: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/protocol.md", "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace["serve_engine"]


def test_documented_engine_loop_serves_exact_texts(qwen3):
    serve_engine = documented_loop()
    eos = primary_eos_id(qwen3)
    closed_early: list[int] = []

    def echo(prompt_ids: list[int], max_tokens: int, stop_ids: list[int], min_tokens: int) -> Iterator[int]:
        """Echoes the prompt, then EOS; notes a generation the engine cancelled before its end."""
        produced = 0
        try:
            for token_id in [*prompt_ids, eos]:
                yield token_id
                produced += 1
        finally:
            if produced < len(prompt_ids):
                closed_early.append(len(prompt_ids))

    passages = load_corpus()
    long_text = "\n".join(passages[:6])  # hundreds of tokens: still generating when a stop string is found
    stop = long_text[40:46]
    cases = {
        "plain": (passages[1], DetokParams(), 4096),
        "hidden-stop": (long_text, DetokParams(stop=[stop]), 4096),
        "visible-stop": (long_text, DetokParams(stop=[stop], include_stop_str_in_output=True), 4096),
        "max-tokens": (passages[2], DetokParams(), 7),
    }
    with short_runtime_dir() as runtime:
        config = bus_config(runtime)
        stop_loop = threading.Event()
        loop = threading.Thread(
            target=serve_engine,
            args=(config, GeneratorEngine(echo), qwen3, lambda: not stop_loop.is_set()),
            daemon=True,
        )
        loop.start()
        workers = [start_process(run_worker, config, worker) for worker in ("w1", "w2")]
        try:
            with FrontCollector(config) as front:
                assert front.wait_for(
                    lambda: front.engine_stats is not None and len(front.engine_stats.workers) == 2, 60
                )
                for rid, (text, detok, max_tokens) in cases.items():
                    front.submit(rid, qwen3.encode(text).ids, RequestParams(max_tokens=max_tokens, detok=detok))
                assert front.wait_done(cases, 60)
                results = {rid: front.requests[rid] for rid in cases}
        finally:
            stop_loop.set()
            loop.join(10)
            for worker in workers:
                stop_process(worker)
    assert not loop.is_alive()
    assert results["plain"].text == passages[1] and results["plain"].finish == "stop"
    assert results["plain"].stop_reason == eos
    assert results["hidden-stop"].text == long_text[: long_text.index(stop)]
    assert results["visible-stop"].text == long_text[: long_text.index(stop) + len(stop)]
    assert results["hidden-stop"].stop_reason == stop and results["visible-stop"].finish == "stop"
    ids = qwen3.encode(passages[2]).ids
    assert results["max-tokens"].text == qwen3.decode(ids[:7]) and results["max-tokens"].finish == "length"
    # both stop-string requests were cancelled in the engine long before their generators ran out
    assert closed_early.count(len(qwen3.encode(long_text).ids)) == 2
