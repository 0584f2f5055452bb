"""The multiprocess directory the supervisor sets up, and the merged /metrics view over every process."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.multiprocess import mark_process_dead as _mark_process_dead

from detok_worker.metrics.families import RESTART_ENV, metrics

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
METRICS_SUBDIR = "metrics"
CONTENT_TYPE = CONTENT_TYPE_LATEST


def prepare_metrics_dir(runtime_dir: str | os.PathLike[str]) -> Path:
    """Create an empty private `<runtime_dir>/metrics` for the children of one run (the caller passes it to them
    as PROMETHEUS_MULTIPROC_DIR; its own environment is left alone)."""
    path = Path(runtime_dir) / METRICS_SUBDIR
    shutil.rmtree(path, ignore_errors=True)  # values of an earlier run must not leak into this one
    path.mkdir(mode=0o700, parents=True)
    return path


def child_env(metrics_dir: str | os.PathLike[str], *, restarts: int = 0) -> dict[str, str]:
    """Environment entries for a child process: where to write its metrics, and (for a restarted worker) that it
    is a restart, which the worker counts when it starts (record_worker_start)."""
    env = {MULTIPROC_ENV: str(metrics_dir)}
    if restarts:
        env[RESTART_ENV] = str(restarts)
    return env


def cleanup_metrics_dir(path: str | os.PathLike[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def mark_process_dead(pid: int, metrics_dir: str | os.PathLike[str]) -> None:
    """Drop the live gauges (live rids, SSE clients) of a child that exited; its counters keep their totals."""
    if Path(metrics_dir).is_dir():
        _mark_process_dead(pid, str(metrics_dir))


def render_latest() -> bytes:
    """The text exposition for /metrics. In multiprocess mode: every process's values of our families, merged,
    plus whatever else this process registered in prometheus_client's default registry (scrape-time collectors
    such as the encode cache's, and the process/GC collectors)."""
    own = metrics()
    path = multiprocess_dir()
    if not (path and Path(path).is_dir()):
        return generate_latest(REGISTRY)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_MergedView(path, own.family_names()))
    return generate_latest(registry)


class _MergedView:
    """Collector: our families merged over processes, then the default registry's other families."""

    def __init__(self, path: str, own_names: frozenset[str]) -> None:
        self._path = path
        self._own_names = own_names

    def collect(self) -> Iterator[Metric]:
        yield from MultiProcessCollector(None, path=self._path).collect()
        for family in REGISTRY.collect():
            if family.name not in self._own_names:
                yield family
