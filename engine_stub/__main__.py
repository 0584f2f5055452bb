"""`engine-stub` / `python -m engine_stub`: run the engine stub on its own (same flags as `detok engine`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from detok_worker.config.flags import run_with_config
from detok_worker.engine.command import add_engine_command_flags, run_engine_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="engine-stub",
        description="Scheduler stand-in: streams token ids of a corpus, the prompt (echo) or a trace to detok workers.",
    )
    add_engine_command_flags(parser)
    return run_with_config("engine-stub", parser.parse_args(argv), run_engine_command)


if __name__ == "__main__":
    sys.exit(main())
