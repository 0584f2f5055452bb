"""`engine-stub` / `python -m engine_stub`: run the engine stub on its own (same flags as `detok engine`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from detok_worker.config import ConfigError
from detok_worker.config.flags import config_from_args
from detok_worker.errors import OperatorError
from detok_worker.process.logs import setup_logging
from detok_worker.process.parent_watch import watch_parent
from engine_stub.command import add_engine_command_flags, run_engine_command

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="engine-stub",
        description="Scheduler stand-in: streams token ids of a corpus, the prompt (echo) or a trace to detok workers.",
    )
    add_engine_command_flags(parser)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"engine-stub: {exc}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging("engine", config.logging.level, config.logging.format)
    watch_parent()
    try:
        return run_engine_command(args, config)
    except KeyboardInterrupt:
        return 130
    except OperatorError as exc:
        print(f"engine-stub: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
