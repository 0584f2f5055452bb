"""How long a detok worker process on this host has waited for a CPU, for the engine's liveness rule (workers.py).

A worker that is runnable but not run (the machine's cores taken by other processes, e.g. a CPU engine's spinning
threads) sends no heartbeat, yet it is not dead: the time its threads spent waiting in the kernel's run queue (the
second field of each /proc/<pid>/task/<tid>/schedstat, in ns) does not count against it. All threads count: a
heartbeat the main thread sent still waits for the process's ZeroMQ I/O thread to be run. Only a sibling of the
engine (a worker started by the same supervisor) is measured: a pid from another host or another pid namespace
names some other process here. A stopped (SIGSTOP) or dead worker is not runnable, so it earns no such time.
The run queue wait of a thread that is still waiting is not in schedstat until it runs: `waiting_now_s` gives that
part for the main thread, from its state and the time since it last ran (/proc/<pid>/sched's `se.exec_start`, on
the scheduler's clock, read against the calling thread's own).
"""

from __future__ import annotations

import os


def _stat_fields(stat_path: str) -> list[bytes]:
    """The fields of a /proc stat file after the command name (which may hold spaces): state, parent pid, ...;
    none when the process is gone."""
    try:
        with open(stat_path, "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def is_sibling(pid: int) -> bool:
    """`pid` is a process of this host started by this engine's parent (the supervisor of `detok serve`)."""
    parent = os.getppid()
    if pid <= 0 or parent <= 1:
        return False
    fields = _stat_fields(f"/proc/{pid}/stat")
    return len(fields) > 1 and int(fields[1]) == parent


def cpu_wait_s(pid: int) -> float | None:
    """Seconds the threads of `pid` have waited runnable for a CPU, summed, since they started; None: not measurable
    (gone, or no scheduler statistics on this kernel)."""
    tasks = f"/proc/{pid}/task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return None
    waited_ns = 0
    for tid in tids:
        try:
            with open(f"{tasks}/{tid}/schedstat", "rb") as schedstat:
                waited_ns += int(schedstat.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return waited_ns / 1e9 if tids else None


def _last_ran_ms(sched_path: str) -> float | None:
    """`se.exec_start` of a /proc sched file: when the thread last ran (while it runs: about now), in ms."""
    try:
        with open(sched_path, "rb") as sched:
            for line in sched:
                if line.startswith(b"se.exec_start"):
                    return float(line.split(b":", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def waiting_now_s(pid: int, slept_at_most_s: float, proc: str = "/proc") -> float:
    """How long the main thread of `pid` has been waiting for a CPU right now, at least: the time since it last ran,
    less the longest it may have slept before it woke (a worker's main thread sleeps at most until its next
    heartbeat is due; its other threads may sleep for ever, so they are not judged this way). 0 when it is not
    runnable (asleep, stopped, gone). `proc`: where procfs is."""
    if _stat_fields(f"{proc}/{pid}/stat")[:1] != [b"R"]:
        return 0.0
    theirs, ours = _last_ran_ms(f"{proc}/{pid}/sched"), _last_ran_ms(f"{proc}/thread-self/sched")
    if theirs is None or ours is None or theirs <= 0:  # 0: it never ran
        return 0.0
    return max(0.0, (ours - theirs) / 1000 - slept_at_most_s)
