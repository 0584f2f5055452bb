"""A worker that does not detokenize: the transport limit of the bus benchmark (bench/bench_bus.py).

It speaks the worker side of the bus exactly like detok's worker (Hello, Heartbeat, one TextBatch per TokenBatch
with step/sent_ns copied, a final delta per rid, Goodbye) and keeps a per-rid offset and token count, but the
text of each Tokens item is one placeholder character per id instead of decoded text. Everything but the
detokenization itself is there: frame decode, the rid table, building, encoding and sending the TextBatch.

    python bench/null_worker.py --config RUNTIME_DIR/config.toml --id WORKER_ID
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq  # noqa: E402

from detok_worker.bus.codec import encode, worker_decoder  # noqa: E402
from detok_worker.bus.messages import (  # noqa: E402
    Goodbye,
    Heartbeat,
    Hello,
    Shutdown,
    TextBatch,
    TextExtras,
    TokenBatch,
)
from detok_worker.bus.sockets import BusSockets, recv_single_frame  # noqa: E402
from detok_worker.config import load_config  # noqa: E402
from detok_worker.process.runtime import (
    stop_on_signals,  # noqa: E402
    watch_parent,  # noqa: E402
)

PLACEHOLDER = "x"


class NullWorker:
    def __init__(self, config_path: str, worker_id: str) -> None:
        self.config = load_config(config_path)
        self.worker_id = worker_id
        self.sockets = BusSockets(self.config)
        self.to_engine = self.sockets.worker_dealer(worker_id)
        self.to_front = self.sockets.front_push()
        self.decoder = worker_decoder()
        self.live: dict[str, list[int]] = {}  # rid -> [offset, n_tokens]
        self.stopping = False

    def run(self) -> None:
        self.to_engine.send(encode(Hello(self.worker_id, os.getpid())))
        interval = self.config.worker.heartbeat_interval_s
        next_heartbeat = 0.0
        try:
            while not self.stopping:
                now = time.monotonic()
                if now >= next_heartbeat:
                    self.to_engine.send(encode(Heartbeat(self.worker_id, len(self.live))), zmq.NOBLOCK)
                    next_heartbeat = now + interval
                if self.to_engine.poll(int(interval * 1000)):
                    self._drain()
        finally:
            self.to_engine.send(encode(Goodbye(self.worker_id)), zmq.NOBLOCK)
            self.sockets.close()

    def _drain(self) -> None:
        for _ in range(256):
            try:
                frame = recv_single_frame(self.to_engine, self.decoder)
            except zmq.Again:
                return
            message = self.decoder.decode(frame) if frame is not None else None
            if isinstance(message, TokenBatch):
                self.to_front.send(encode(self._handle(message)))
            elif isinstance(message, Shutdown):
                self.stopping = True
                return

    def _handle(self, batch: TokenBatch) -> TextBatch:
        live = self.live
        for open_ in batch.opens:
            live[open_.rid] = [0, 0]
        out = TextBatch(self.worker_id, batch.sent_ns, batch.step)
        for row, rid in enumerate(batch.rids):  # plain text, one row per row in
            state = live.get(rid)
            if state is None:
                continue
            extras = batch.extras.get(row)
            n = 1 if extras is None else len(extras.ids)
            if extras is not None and extras.finish is not None:
                out.extras[len(out.rids)] = TextExtras(finish=extras.finish)
                del live[rid]
            elif not n:
                continue
            out.rids.append(rid)
            out.offsets.append(state[0])
            out.texts.append(PLACEHOLDER * n)
            state[0] += n
            state[1] += n
            out.n_tokens.append(state[1])
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--id", required=True)
    args = parser.parse_args()
    watch_parent()
    worker = NullWorker(args.config, args.id)

    def stop() -> None:
        worker.stopping = True

    with stop_on_signals(stop):
        worker.run()


if __name__ == "__main__":
    main()
