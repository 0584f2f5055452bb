"""Ids the model can emit but the tokenizer lacks, over real sockets: an engine loop on EngineLink(vocab_size=...)
sends them among requests' ids, a real worker process decodes them as the tokenizer's full decode does (no text,
still counted as tokens), and an id past the model's vocabulary ends only its own request. The gRPC gateway's link
gets the engine's GetModelInfo vocab_size (the test engine server reports its tokenizer's)."""

from __future__ import annotations

import asyncio
import threading

from helpers.bus_peers import bus_config, short_runtime_dir, start_process, stop_process
from helpers.grpc_engine_server import EngineServer
from helpers.tokenizer_files import reference_hf_tokenizer

from detok_worker.bus.collector import FrontCollector
from detok_worker.bus.messages import RequestParams
from detok_worker.config import DetokConfig
from detok_worker.engine.grpc_api import connect_engine
from detok_worker.engine.link import EngineLink
from detok_worker.engine.sources.grpc_gateway import gateway_link
from detok_worker.worker.process import run_worker

MODEL_VOCAB = 151_936  # Qwen3's config.json vocab_size; its tokenizer has 151,669 ids


def _engine(config: DetokConfig, outputs: dict[str, list[int]], running: threading.Event) -> None:
    """Each request's output is pushed at once: its entry in `outputs`, whatever its prompt."""
    link = EngineLink(config, vocab_size=MODEL_VOCAB)
    try:
        while running.is_set():
            for submit in link.poll(0.005).submitted:
                if link.accept(submit) is not None:
                    link.push(submit.rid, outputs[submit.rid], "stop")
            link.step()
    finally:
        link.close()


def test_a_worker_process_decodes_ids_the_tokenizer_lacks_as_no_text(qwen3) -> None:
    ids = qwen3.encode("Family 👨‍👩‍👧 at the beach 🏖️, 今天的天气很好。").ids
    lacking = qwen3.vocab_size
    mixed = [lacking, *ids[:3], lacking + 1, *ids[3:7], MODEL_VOCAB - 1, *ids[7:], lacking]
    outputs = {"ok": mixed, "bad": [*ids[:3], lacking, MODEL_VOCAB, *ids[3:]]}
    with short_runtime_dir() as runtime:
        config = bus_config(runtime)
        running = threading.Event()
        running.set()
        loop = threading.Thread(target=_engine, args=(config, outputs, running), daemon=True)
        loop.start()
        worker = start_process(run_worker, config, "w1")
        try:
            with FrontCollector(config) as front:
                assert front.wait_for(lambda: front.engine_stats is not None and front.engine_stats.workers, 60)
                for rid, output in outputs.items():
                    front.submit(rid, qwen3.encode("Hello").ids, RequestParams(max_tokens=len(output) - 1))
                assert front.wait_done(outputs, 30)
                ok, bad = front.requests["ok"], front.requests["bad"]
        finally:
            running.clear()
            loop.join(10)
            stop_process(worker)
    shown = mixed[:-1]  # max_tokens ends the request before its last id
    assert (ok.text, ok.n_tokens, ok.finish) == (reference_hf_tokenizer("qwen3").decode(shown), len(shown), "length")
    assert ok.text == qwen3.decode(ids) and ok.gaps == 0
    assert (bad.finish, bad.n_tokens) == ("error", 4)
    assert bad.error == f"token id {MODEL_VOCAB} is out of range for the model (valid ids: ints 0..{MODEL_VOCAB - 1})"


def test_the_grpc_gateway_gives_its_workers_the_engines_vocabulary_size(qwen3) -> None:
    server = EngineServer("--source", "echo")

    async def gateway_vocab_size(config: DetokConfig) -> tuple[int, int]:
        api = await connect_engine(server.url, "auto", qwen3, 30.0)
        try:
            link = gateway_link(config, qwen3, api)
            link.close()
            return api.vocab_size, link.scheduler.vocab_size
        finally:
            await api.channel.close()

    try:
        with short_runtime_dir() as runtime:
            assert asyncio.run(gateway_vocab_size(bus_config(runtime))) == (qwen3.vocab_size, qwen3.vocab_size)
    finally:
        server.cleanup()
