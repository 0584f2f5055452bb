"""What a front end costs while it serves nothing, thread by thread: wakeups per second (the scheduler's run count)
and CPU ms per second (the scheduler's runtime), from /proc/PID/task/TID/schedstat over a window, for every
front-side process of one bench_vllm system (vLLM's engine core and model worker excluded, as in bench_vllm).

--probe first measures the machine: a bare Python loop that sleeps and wakes R times a second, touching M MiB of
its own memory at each wakeup. On an ordinary machine its cost follows the wakeups (tens of microseconds each); on
a VM whose host takes back guest pages left idle, each wakeup also pays for re-touching its pages, so a process costs
CPU for living whatever its wakeups.

    python bench/bench_idle.py [--systems detok-vllm vllm] [--window 20] [--workers 2] [--probe]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine_line
from vllm_procs import SYSTEMS, engine_flags, running_system, tokenizer_vocab, vllm_cpu

PROBE = """
import sys, time
rate, mib, window = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
memory = bytearray(mib << 20)
start_cpu, start, wakes = time.process_time(), time.monotonic(), 0
while time.monotonic() - start < window:
    time.sleep(1 / rate)
    for i in range(0, len(memory), 4096):
        memory[i] ^= 1
    wakes += 1
cpu = time.process_time() - start_cpu
print(f"{cpu / window * 1000:.1f} {cpu / wakes * 1000:.2f}")
"""

Sample = dict[tuple[str, str, str], tuple[int, int]]  # (role, tid, thread name) -> (runtime ns, run count)


def sample(pids: dict[str, int]) -> Sample:
    found: Sample = {}
    for role, pid in pids.items():
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                runtime, _, count = map(int, (task / "schedstat").read_text().split())
                name = (task / "comm").read_text().strip()
            except (OSError, ValueError):
                continue  # the thread ended
            found[(role, task.name, name)] = (runtime, count)
    return found


def idle_cost(system: str, window_s: float, workers: int, model: Path, workdir: Path) -> None:
    with running_system(system, model, engine_flags(512, 8192), workdir, workers, {}) as running:
        time.sleep(5)  # past the start-up's last work
        front, _ = running.front_side()
        before, start = sample(front), time.monotonic()
        time.sleep(window_s)
        after, elapsed = sample(front), time.monotonic() - start
    roles: dict[str, list[float]] = {}
    print(f"\n{system}: {window_s:.0f} s idle; per thread: CPU ms/s, wakeups/s")
    for key, (runtime, count) in sorted(after.items()):
        if key not in before:
            continue
        cpu_ms = (runtime - before[key][0]) / 1e6 / elapsed
        wakes = (count - before[key][1]) / elapsed
        total = roles.setdefault(key[0], [0.0, 0.0])
        total[0] += cpu_ms
        total[1] += wakes
        if cpu_ms >= 0.05 or wakes >= 0.05:
            print(f"  {key[0]:<16} {key[2]:<16} {cpu_ms:7.2f} {wakes:7.1f}")
    for role, (cpu_ms, wakes) in roles.items():
        print(f"  {role:<33} {cpu_ms:7.2f} {wakes:7.1f}  (process)")
    print(f"  {'all':<33} {sum(c for c, _ in roles.values()):7.2f} {sum(w for _, w in roles.values()):7.1f}")


def probe(window_s: float) -> None:
    print("bare Python loop: wakeups/s, MiB touched per wakeup -> CPU ms/s, ms per wakeup")
    for mib in (0, 1, 16):
        for rate in (0.2, 1.0, 10.0, 50.0):
            argv = [sys.executable, "-c", PROBE, str(rate), str(mib), str(window_s)]
            out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
            print(f"  {rate:5.1f} /s  {mib:3d} MiB  {float(out[0]):7.1f} ms/s  {float(out[1]):7.2f} ms/wakeup")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=["detok-vllm", "vllm"])
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per system")
    parser.add_argument("--workers", type=int, default=2, help="detok's worker processes")
    parser.add_argument("--probe", action="store_true", help="measure a bare Python loop first")
    args = parser.parse_args()
    print(machine_line())
    if args.probe:
        probe(min(args.window, 10.0))
    vllm_cpu.require_venv()
    model = vllm_cpu.model_dir()
    tokenizer_vocab(model)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for system in args.systems:
                idle_cost(system, args.window, args.workers, model, Path(tmp))
    finally:
        shutil.rmtree(model, ignore_errors=True)


if __name__ == "__main__":
    main()
