"""Token traces: a recorded run of the bus, replayable by the trace engine source.

File format (version 1): a stream of records, each a 4-byte little-endian unsigned length followed by that many
bytes of msgpack. The first record is a TraceHeader; then TraceRequest (a request arrived: rid, prompt ids,
params) and TraceTokens (ids the engine emitted for a rid, and the finish on its last record) in time order.
Times are nanoseconds since the trace's start. A file cut short by a crash reads fine up to its last whole record.

`TraceWriter(path, header)` writes one; `read_trace(path)` returns a Trace with one RecordedRequest per request;
`export_jsonl(trace, path)` writes the same as JSON lines for people and other tools.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
import struct
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from detok_worker.bus.messages import RequestParams
from detok_worker.errors import OperatorError
from detok_worker.tokenizer.protocol import Tokenizer

TRACE_VERSION = 1
_LENGTH = struct.Struct("<I")
MAX_RECORD_BYTES = 256 * 1024 * 1024


class TraceFormatError(OperatorError, ValueError):
    """A file is not a trace, is corrupt before its last record, or cannot be opened or created."""


class TraceInputError(OperatorError, ValueError):
    """What a trace is made from (a corpus, ShareGPT JSON) or replayed with (the tokenizer) cannot be used."""


class TraceHeader(msgspec.Struct, tag="header", array_like=True):
    version: int
    tokenizer: str  # tokenizer name
    tokenizer_hash: str  # tokenizer_fingerprint() of the tokenizer the ids belong to
    created: float  # unix time
    source: str  # what produced the trace: "engine", "synth:corpus", "record", ...
    meta: dict[str, str] = {}


class TraceRequest(msgspec.Struct, tag="request", array_like=True, gc=False):
    t_ns: int
    rid: str
    prompt_ids: list[int]
    params: RequestParams


class TraceTokens(msgspec.Struct, tag="tokens", array_like=True, gc=False):
    t_ns: int
    rid: str
    ids: list[int]
    finish: str | None = None


TraceRecord = TraceHeader | TraceRequest | TraceTokens

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TraceRecord)


@dataclass(slots=True)
class RecordedRequest:
    rid: str
    t_ns: int  # arrival, ns since the trace start
    prompt_ids: list[int]
    params: RequestParams
    output_ids: list[int] = field(default_factory=list)
    token_times_ns: list[int] = field(default_factory=list)  # one per output id
    finish: str | None = None


@dataclass(slots=True)
class Trace:
    header: TraceHeader
    requests: list[RecordedRequest]
    truncated: bool = False  # the file ended inside a record (e.g. the recorder was killed)
    orphan_tokens: int = 0  # TraceTokens records for a rid with no TraceRequest (skipped)

    @property
    def total_output_tokens(self) -> int:
        return sum(len(request.output_ids) for request in self.requests)

    def summary(self) -> dict[str, Any]:
        """The header and statistics of the trace (`detok trace inspect`)."""
        outputs = [len(request.output_ids) for request in self.requests]
        prompts = [len(request.prompt_ids) for request in self.requests]
        ends = [request.token_times_ns[-1] if request.token_times_ns else request.t_ns for request in self.requests]
        header = self.header
        return {
            "version": header.version,
            "tokenizer": header.tokenizer,
            "tokenizer_hash": header.tokenizer_hash,
            "created": header.created,
            "source": header.source,
            "meta": header.meta,
            "requests": len(self.requests),
            "output_tokens": sum(outputs),
            "prompt_tokens": sum(prompts),
            "output_tokens_p50": percentile(outputs, 50),
            "output_tokens_max": max(outputs, default=0),
            "prompt_tokens_mean": round(statistics.fmean(prompts), 1) if prompts else 0,
            "duration_s": round(max(ends, default=0) / 1e9, 3),
            "finish": dict(Counter(str(request.finish) for request in self.requests)),
            "truncated": self.truncated,
            "orphan_tokens": self.orphan_tokens,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """A stable hash of what makes ids mean text: the vocabulary (id -> token) and the eos ids."""
    digest = hashlib.sha256()
    digest.update(f"{tokenizer.vocab_size}|{sorted(tokenizer.eos_token_ids)}|".encode())
    for token_id in range(tokenizer.vocab_size):
        digest.update((tokenizer.id_to_token(token_id) or "").encode("utf-8", "surrogatepass"))
        digest.update(b"\x00")
    return digest.hexdigest()[:32]


def make_header(tokenizer: Tokenizer, source: str, meta: dict[str, str] | None = None) -> TraceHeader:
    return TraceHeader(
        version=TRACE_VERSION,
        tokenizer=str(getattr(tokenizer, "name", "")),
        tokenizer_hash=tokenizer_fingerprint(tokenizer),
        created=time.time(),
        source=source,
        meta=dict(meta or {}),
    )


class TraceWriter:
    """Writes a trace file. Times default to "now" relative to when the writer was opened."""

    def __init__(self, path: str | Path, header: TraceHeader) -> None:
        self.path = Path(path)
        self.header = header
        try:
            self._file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed by close()/__exit__
        except OSError as exc:
            raise TraceFormatError(f"cannot create trace file {self.path}: {exc}") from exc
        self._start_ns = time.monotonic_ns()
        self.write(header)

    def elapsed_ns(self) -> int:
        return time.monotonic_ns() - self._start_ns

    def request(self, rid: str, prompt_ids: Sequence[int], params: RequestParams, t_ns: int | None = None) -> None:
        self.write(TraceRequest(self.elapsed_ns() if t_ns is None else t_ns, rid, list(prompt_ids), params))

    def tokens(self, rid: str, ids: Sequence[int], finish: str | None = None, t_ns: int | None = None) -> None:
        self.write(TraceTokens(self.elapsed_ns() if t_ns is None else t_ns, rid, list(ids), finish))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, record: TraceRecord) -> None:
        payload = _encoder.encode(record)
        self._file.write(_LENGTH.pack(len(payload)))
        self._file.write(payload)


class TraceReader:
    """Iterates a trace file's records in file order (the header first). A truncated last record ends the
    iteration quietly and sets `truncated`; anything else that is not a trace raises TraceFormatError."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self.truncated = False

    def __iter__(self) -> Iterator[TraceRecord]:
        try:
            file = open(self.path, "rb")  # noqa: SIM115 - closed by the with below (generator)
        except OSError as exc:
            raise TraceFormatError(f"cannot open trace {self.path}: {exc}") from exc
        with file:
            for index in itertools.count():
                prefix = file.read(_LENGTH.size)
                if len(prefix) < _LENGTH.size:
                    self.truncated = bool(prefix)
                    return
                (length,) = _LENGTH.unpack(prefix)
                if length > MAX_RECORD_BYTES:
                    raise TraceFormatError(f"{self.path}: record {index} claims {length} bytes; not a trace or corrupt")
                payload = file.read(length)
                if len(payload) < length:
                    self.truncated = True
                    return
                yield self._decode(payload, index)

    def _decode(self, payload: bytes, index: int) -> TraceRecord:
        try:
            record = _decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise TraceFormatError(f"{self.path}: record {index} is not a trace record: {exc}") from exc
        if (index == 0) != isinstance(record, TraceHeader):
            where = "does not start with a header" if index == 0 else f"has a second header at record {index}"
            raise TraceFormatError(f"{self.path} {where}; not a detok trace")
        if index == 0 and record.version != TRACE_VERSION:
            raise TraceFormatError(f"{self.path}: trace version {record.version}, this detok reads {TRACE_VERSION}")
        return record


def read_trace(path: str | Path) -> Trace:
    reader = TraceReader(path)
    records = iter(reader)
    header = next(records, None)
    if not isinstance(header, TraceHeader):
        raise TraceFormatError(f"{path} is empty; not a detok trace")
    requests: list[RecordedRequest] = []
    live: dict[str, RecordedRequest] = {}  # rid -> its latest request (rids may be reused after they end)
    orphans = 0
    for record in records:
        if isinstance(record, TraceRequest):
            request = RecordedRequest(record.rid, record.t_ns, record.prompt_ids, record.params)
            requests.append(request)
            live[record.rid] = request
            continue
        request = live.get(record.rid)
        if request is None:
            orphans += 1
            continue
        request.output_ids.extend(record.ids)
        request.token_times_ns.extend([record.t_ns] * len(record.ids))
        if record.finish is not None:
            request.finish = record.finish
    return Trace(header, requests, truncated=reader.truncated, orphan_tokens=orphans)


def write_trace(path: str | Path, trace: Trace) -> None:
    """Write a Trace (e.g. a synthesized one) in time order: requests at arrival, tokens at their times."""
    events: list[tuple[int, int, TraceRecord]] = []
    for order, request in enumerate(trace.requests):
        arrival = TraceRequest(request.t_ns, request.rid, request.prompt_ids, request.params)
        events.append((request.t_ns, order, arrival))
        timed = zip(request.token_times_ns, request.output_ids, strict=True)  # one time per output id
        for t_ns, step in itertools.groupby(timed, key=lambda pair: pair[0]):
            events.append((t_ns, order, TraceTokens(t_ns, request.rid, [token for _, token in step])))
        if request.finish is not None:
            last = request.token_times_ns[-1] if request.token_times_ns else request.t_ns
            events.append((last, order, TraceTokens(last, request.rid, [], request.finish)))
    events.sort(key=lambda event: (event[0], event[1]))
    with TraceWriter(path, trace.header) as writer:
        for _, _, record in events:
            writer.write(record)


def export_jsonl(trace: Trace, path: str | Path, tokenizer: Tokenizer | None = None) -> None:
    """One JSON object per line: the header, then one per request (with its decoded text if a tokenizer is given)."""
    with open(path, "w", encoding="utf-8") as out:
        header = msgspec.structs.asdict(trace.header)
        out.write(json.dumps({"type": "header", **header, "truncated": trace.truncated}, ensure_ascii=False) + "\n")
        for request in trace.requests:
            line: dict[str, Any] = {
                "type": "request",
                "rid": request.rid,
                "t_ns": request.t_ns,
                "prompt_ids": request.prompt_ids,
                "params": _params_to_json(request.params),
                "output_ids": request.output_ids,
                "token_times_ns": request.token_times_ns,
                "finish": request.finish,
            }
            if tokenizer is not None:
                line["text"] = tokenizer.decode(request.output_ids, skip_special_tokens=False)
            out.write(json.dumps(line, ensure_ascii=False) + "\n")


def _params_to_json(params: RequestParams) -> dict[str, Any]:
    """Flat JSON of a request's parameters (generation fields, then the detok ones), for people."""
    named = _named(params)
    detok = named.pop("detok")
    return {**named, **detok}


def _named(value: Any) -> Any:
    """Structs (array-like on the wire) as objects with their field names, for JSON."""
    if isinstance(value, msgspec.Struct):
        return {name: _named(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, dict):
        return {str(key): _named(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_named(item) for item in value]
    return value
