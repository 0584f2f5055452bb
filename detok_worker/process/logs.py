"""One logging setup for every detok process: human-readable lines by default, JSON lines with
`--log-format json`; every record carries the process role and pid. Plus a rate limiter for warnings that
can repeat at line rate (bad frames, slow clients), so a flood of bad input cannot flood the log."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Any, TextIO

from detok_worker.config.schema import LOG_FORMATS

HUMAN_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(role)s[%(process)d] %(name)s: %(message)s"
HUMAN_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (unix seconds), level, role, pid, logger, msg, and exc when present. The pid is
    the record's own `process` (read per record by logging, so it stays right after a fork)."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "role": self.role,
            "pid": record.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def setup_logging(role: str, level: str = "INFO", log_format: str = "human", stream: TextIO | None = None) -> None:
    """Configure the root logger of this process (idempotent: replaces handlers set up earlier)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(role))
    else:
        handler.setFormatter(logging.Formatter(HUMAN_FORMAT, HUMAN_DATE_FORMAT, defaults={"role": role}))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # uvicorn installs its own handlers unless told otherwise; route its records through ours.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


class RateLimiter:
    """Allows one event per key per `interval_s`; counts what it suppressed in between.

    Usage: `if (suppressed := limiter.allow(key)) is not None: log.warning("... (%d suppressed)", ..., suppressed)`.
    Thread-safe; memory is bounded by `max_keys` (the oldest keys are forgotten first).
    """

    def __init__(self, interval_s: float = 10.0, max_keys: int = 1024) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> int | None:
        """None if the event should be dropped; else the number of events suppressed since the last allowed one."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            if last is None and len(self._last) >= self.max_keys:
                oldest = next(iter(self._last))
                del self._last[oldest]
                self._suppressed.pop(oldest, None)
            self._last.pop(key, None)
            self._last[key] = now
            return self._suppressed.pop(key, 0)


def warn_rate_limited(
    logger: logging.Logger, limiter: RateLimiter, key: str, msg: str, *args: object, level: int = logging.WARNING
) -> None:
    """Log `msg % args` at most once per limiter interval for `key`, noting how many were suppressed."""
    suppressed = limiter.allow(key)
    if suppressed is None:
        return
    if suppressed:
        logger.log(level, msg + " (%d similar messages suppressed)", *args, suppressed)
    else:
        logger.log(level, msg, *args)
