"""`detok trace synth | inspect | replay | record`: make, look at, and run token traces (`trace.format.Trace`).

synth   text corpus or ShareGPT-style JSON -> trace (prompts through the chat template, outputs = the texts'
        tokens then EOS; Poisson arrivals, fixed inter-token time), seeded, so the same flags give the same file.
inspect header + statistics of a trace (and an optional JSON-lines export).
replay  engine stub replaying the trace + N workers as real processes, with this process as the front-side
        collector (no HTTP): prints per-request texts (--texts) and a summary (`trace.replay.replay_trace`).
record  `detok serve` with the engine recording every request and emitted token to a file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from detok_worker.config import DetokConfig
from detok_worker.config.flags import (
    SERVICE_FLAGS,
    add_command,
    add_config_flags,
    add_engine_flags,
    add_worker_count_flag,
)

# The trace, tokenizer and engine modules are imported by the commands that use them: every detok process
# builds this parser, and most never run a trace command.


def cmd_synth(args: argparse.Namespace, config: DetokConfig) -> int:
    from tqdm import tqdm

    from detok_worker.tokenizer import load_configured_tokenizer
    from detok_worker.trace.format import write_trace
    from detok_worker.trace.synth import corpus_pairs, sharegpt_pairs, synth_trace
    from engine_stub.planned import load_corpus, primary_eos_id

    tokenizer = load_configured_tokenizer(config)
    rng = random.Random(args.seed)
    if args.sharegpt:
        pairs = sharegpt_pairs(Path(args.sharegpt), tokenizer)
        if args.requests:
            pairs = [pairs[i % len(pairs)] for i in range(args.requests)]
    else:
        passages = load_corpus(args.corpus or None)
        pairs = corpus_pairs(passages, args.requests or len(passages), tokenizer, rng)
    trace = synth_trace(
        tqdm(pairs, desc="synth", unit="req"),
        tokenizer,
        eos_id=primary_eos_id(tokenizer),
        max_tokens=args.max_tokens,
        rate=args.rate,
        itl_ms=args.itl_ms,
        rng=rng,
        source="synth:sharegpt" if args.sharegpt else "synth:corpus",
        meta={"seed": str(args.seed), "rate": str(args.rate)},
    )
    write_trace(args.output, trace)
    print(f"wrote {args.output}: {len(trace.requests)} requests, {trace.total_output_tokens} output tokens")
    return 0


def cmd_inspect(args: argparse.Namespace, config: DetokConfig) -> int:
    from detok_worker.tokenizer import load_configured_tokenizer
    from detok_worker.trace.format import export_jsonl, read_trace

    trace = read_trace(args.trace_file)
    summary = trace.summary()
    if args.json:
        print(json.dumps(summary, ensure_ascii=False))
    else:
        width = max(len(key) for key in summary)
        for key, value in summary.items():
            print(f"{key:<{width}}  {value}")
    if args.jsonl:
        export_jsonl(trace, args.jsonl, load_configured_tokenizer(config))
        print(f"wrote {args.jsonl}", file=sys.stderr)
    return 0


def cmd_replay(args: argparse.Namespace, config: DetokConfig) -> int:
    from detok_worker.process.logs import setup_logging
    from detok_worker.trace.replay import print_replay_report, replay_trace

    setup_logging("replay", config.logging.level, config.logging.format)
    report = replay_trace(config, args.trace_file, timeout_s=args.timeout)
    print_replay_report(report, texts=args.texts, as_json=args.json)
    return 0 if report.complete else 1


def cmd_record(args: argparse.Namespace, config: DetokConfig) -> int:
    import msgspec

    from detok_worker.cli.service import run_service

    engine = msgspec.structs.replace(config.engine, record=str(Path(args.output).resolve()))
    return run_service(msgspec.structs.replace(config, engine=engine), args.startup_timeout)


def add_trace_commands(commands: argparse._SubParsersAction) -> None:
    trace = commands.add_parser(
        "trace",
        help="make, inspect and replay token traces",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = trace.add_subparsers(dest="trace_command", metavar="ACTION", required=True)

    synth = add_command(actions, "synth", cmd_synth, "text corpus or ShareGPT JSON -> trace", add_config_flags)
    synth.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write")
    inputs = synth.add_mutually_exclusive_group()
    inputs.add_argument("--corpus", metavar="DIR", help="directory of *.txt passages (default: the shipped corpus)")
    inputs.add_argument("--sharegpt", metavar="FILE", help="ShareGPT-style JSON: every assistant turn is a request")
    synth.add_argument("--requests", type=int, default=0, help="number of requests (default: one per passage/turn)")
    synth.add_argument("--max-tokens", type=int, default=512, help="output tokens per request at most")
    synth.add_argument("--rate", type=float, default=0.0, help="arrivals per second, Poisson (0 = all at once)")
    synth.add_argument("--itl-ms", type=float, default=20.0, help="time between a request's tokens")
    synth.add_argument("--seed", type=int, default=0)

    inspect = add_command(actions, "inspect", cmd_inspect, "header and statistics of a trace", add_config_flags)
    inspect.add_argument("trace_file", metavar="FILE")
    inspect.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    inspect.add_argument("--jsonl", metavar="OUT", help="also export the trace as JSON lines (with decoded texts)")

    replay = add_command(
        actions,
        "replay",
        cmd_replay,
        "replay a trace through the engine stub and N workers (no HTTP)",
        add_config_flags,
        add_worker_count_flag,
        add_engine_flags,
    )
    replay.add_argument("trace_file", metavar="FILE")
    replay.add_argument("--texts", action="store_true", help="print every request's final text")
    replay.add_argument("--json", action="store_true", help="print texts and summary as JSON")
    replay.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")

    record = add_command(
        actions,
        "record",
        cmd_record,
        "run the service and record the engine's bus traffic to a file",
        *SERVICE_FLAGS,
        description="Runs `detok serve` with the engine recording every request it takes and every token it emits. "
        "For processes started separately (e.g. the Procfile) start the engine with `detok engine --record FILE`.",
    )
    record.add_argument("-o", "--output", required=True, metavar="FILE", help="trace file to write")
    record.add_argument("--startup-timeout", type=float, default=60.0, metavar="S")
