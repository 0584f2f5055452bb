"""`detok trace replay`: a trace through the real pipeline without HTTP.

The engine stub (child process) generates the trace's own requests (`detok engine --replay FILE`), N detok
workers (child processes) turn the ids into text, and this process plays the front (FrontCollector): texts
assembled by offset (so a re-opened rid's repeated text is dropped), one result per request, and the
engine-to-front latency of every batch (TokenBatch.sent_ns, carried through by the worker, to arrival here; both
Unix wall-clock ns, see docs/protocol.md). The elapsed time runs from the first text to the last.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import msgspec

from detok_worker.bus.collector import CollectedRequest, FrontCollector
from detok_worker.bus.messages import FINISH_ERROR
from detok_worker.config import DetokConfig
from detok_worker.process.supervisor import Supervisor
from detok_worker.tokenizer import load_configured_tokenizer
from detok_worker.tokenizer.protocol import Tokenizer
from detok_worker.trace.format import Trace, TraceInputError, percentile, read_trace, tokenizer_fingerprint

log = logging.getLogger(__name__)


def request_json(request: CollectedRequest) -> dict[str, object]:
    return {name: getattr(request, name) for name in ("rid", "text", "n_tokens", "finish", "stop_reason", "error")}


@dataclass
class ReplayReport:
    requests: list[CollectedRequest]
    workers: int
    elapsed_s: float = 0.0
    latencies_ns: list[int] = field(default_factory=list)

    @property
    def gaps(self) -> int:
        """Requests whose deltas had a gap (text lost upstream; must stay 0)."""
        return sum(request.gaps for request in self.requests)

    @property
    def finished(self) -> int:
        return sum(1 for request in self.requests if request.finish is not None)

    @property
    def complete(self) -> bool:
        return self.finished == len(self.requests) and self.gaps == 0

    @property
    def tokens(self) -> int:
        return sum(request.n_tokens for request in self.requests)

    def summary(self) -> dict[str, object]:
        latencies_ms = [ns / 1e6 for ns in self.latencies_ns]
        return {
            "requests": len(self.requests),
            "finished": self.finished,
            "errors": sum(1 for request in self.requests if request.finish == FINISH_ERROR),
            "workers": self.workers,
            "tokens": self.tokens,
            "elapsed_s": round(self.elapsed_s, 4),
            "tokens_per_s": round(self.tokens / self.elapsed_s, 1) if self.elapsed_s > 0 else 0.0,
            "latency_p50_ms": round(percentile(latencies_ms, 50), 3),
            "latency_p99_ms": round(percentile(latencies_ms, 99), 3),
            "batches": len(self.latencies_ns),
            "gaps": self.gaps,
        }


def check_trace_tokenizer(trace: Trace, tokenizer: Tokenizer) -> None:
    """Refuse to replay ids that belong to another tokenizer (they would decode to the wrong text)."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    if trace.header.tokenizer_hash != fingerprint:
        raise TraceInputError(
            f"the trace was made with tokenizer {trace.header.tokenizer!r} ({trace.header.tokenizer_hash}); the "
            f"configured tokenizer {getattr(tokenizer, 'name', '?')!r} is {fingerprint}: pass --tokenizer"
        )


def replay_trace(config: DetokConfig, path: str | Path, *, timeout_s: float = 600.0) -> ReplayReport:
    """Run the replay to completion (or timeout / Ctrl-C) and report. Child processes are always cleaned up."""
    from tqdm import tqdm

    trace = read_trace(path)
    check_trace_tokenizer(trace, load_configured_tokenizer(config))
    rids = [request.rid for request in trace.requests]
    engine = msgspec.structs.replace(config.engine, record="")  # a replay is not a new recording
    supervisor = Supervisor(
        msgspec.structs.replace(config, engine=engine),
        with_front=False,
        engine_args=["--replay", str(Path(path).resolve())],
    )
    supervisor.install_signal_handlers()
    supervisor.prepare()
    collector = FrontCollector(supervisor.config)  # binds the front endpoint before the children start
    pending = set(rids)
    try:
        supervisor.start()
        with tqdm(total=len(rids), desc="replay", unit="req", file=sys.stderr, disable=None) as progress:

            def over() -> bool:
                ended = [rid for rid in pending if (request := collector.requests.get(rid)) and request.done]
                pending.difference_update(ended)
                progress.update(len(ended))
                failed = supervisor.check_children()
                if failed is not None:
                    log.error("%s exited during the replay", failed.name)
                return not pending or supervisor.stopping or failed is not None

            collector.wait_for(over, timeout_s)
        if pending:
            log.error("replay incomplete: %d of %d requests finished", len(rids) - len(pending), len(rids))
    finally:
        collector.close()
        supervisor.close()
    requests = [collector.requests.get(rid) or CollectedRequest(rid) for rid in rids]
    first_ns = min((r.first_ns for r in requests if r.first_ns is not None), default=0)
    last_ns = max((r.last_ns or 0 for r in requests), default=0)
    return ReplayReport(
        requests=requests,
        workers=config.worker.count,
        elapsed_s=max(last_ns - first_ns, 0) / 1e9,
        latencies_ns=collector.latencies_ns,
    )


def print_replay_report(report: ReplayReport, *, texts: bool, as_json: bool, out: TextIO | None = None) -> None:
    out = out if out is not None else sys.stdout
    if as_json:
        body: dict[str, object] = {"summary": report.summary()}
        if texts:
            body["requests"] = [request_json(request) for request in report.requests]
        out.write(json.dumps(body, ensure_ascii=False) + "\n")
        return
    if texts:
        for request in report.requests:
            out.write(json.dumps(request_json(request), ensure_ascii=False) + "\n")
    summary = report.summary()
    out.write(
        f"replayed {summary['finished']}/{summary['requests']} requests through {summary['workers']} workers: "
        f"{summary['tokens']} tokens in {summary['elapsed_s']} s ({summary['tokens_per_s']} tokens/s); "
        f"engine->front latency p50 {summary['latency_p50_ms']} ms, p99 {summary['latency_p99_ms']} ms "
        f"over {summary['batches']} batches; errors {summary['errors']}\n"
    )
