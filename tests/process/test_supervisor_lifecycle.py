"""`detok serve` as an operator sees it: children, worker restart, runtime scaling, SIGTERM, SIGKILL, failures."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from helpers.fixtures import FIXTURE_TOKENIZER_DIRS, load_fixture_tokenizer
from helpers.serve_helpers import REPO, ServeProcess, pid_alive, serving, wait_for

from detok_worker.process.supervisor import PID_FILE, RUNTIME_DIR_PREFIX, make_runtime_dir, sweep_stale_runtime_dirs
from engine_stub.planned import load_corpus

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inspects /proc")


def complete(serve: ServeProcess, prompt: str = "Hello", max_tokens: int = 16) -> dict:
    model = httpx.get(f"{serve.url}/v1/models", timeout=10).json()["data"][0]["id"]
    response = httpx.post(
        f"{serve.url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens}, timeout=30
    )
    assert response.status_code == 200, response.text
    return response.json()


def check_corpus_streams(serve: ServeProcess) -> None:
    """Smoke check of the corpus source over a streaming chat: each text is a whole corpus passage (EOS) or the
    start of one (max_tokens), and usage matches."""
    tokenizer = load_fixture_tokenizer("qwen3")
    passages = {tokenizer.decode(tokenizer.encode(p).ids) for p in load_corpus()}
    client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="x", max_retries=0, timeout=30)
    for max_tokens in (4000, 5):
        stream = client.chat.completions.create(
            model=client.models.list().data[0].id,
            messages=[{"role": "user", "content": "Tell me something."}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1].usage
        if max_tokens == 5:
            assert finish == ["length"] and usage.completion_tokens == 5
            # the decode of a passage's first 5 ids (it ends in U+FFFD when they end inside a character)
            assert text in {tokenizer.decode(tokenizer.encode(p).ids[:5]) for p in load_corpus()}
        else:
            assert finish == ["stop"] and text in passages
            assert usage.completion_tokens == len(tokenizer.encode(text).ids) + 1  # + EOS


def ignores_sigttou(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(ignored & (1 << (signal.SIGTTOU - 1)))


def worker_pids_in_stats(serve: ServeProcess) -> dict[str, int]:
    return {wid: stats["pid"] for wid, stats in serve.stats()["workers"].items()}


def test_restart_scale_and_sigterm() -> None:
    with serving("--workers", "2", "--step-interval-ms", "1", "--set", "worker.stats_interval_s=0.1") as serve:
        children = serve.children()
        roles = sorted(cmd.split("detok_worker.cli ")[1].split()[0] for cmd in children.values())
        assert roles == ["engine", "front", "worker", "worker"]
        # each in its own process group (a terminal's Ctrl-C reaches the supervisor only), all in its session (one
        # claimant of the CPU where the kernel shares it per session), SIGTTOU ignored (a background job's writes)
        session = os.getsid(serve.proc.pid)
        own_session = sys.version_info < (3, 11)  # no process_group there: a session each
        assert [(os.getpgid(pid), os.getsid(pid), ignores_sigttou(pid)) for pid in children] == [
            (pid, pid if own_session else session, True) for pid in children
        ]
        assert {p.name for p in serve.runtime_dir.iterdir()} >= {"engine.sock", "workers.sock", "front.sock"}
        assert serve.runtime_dir.stat().st_mode & 0o777 == 0o700

        # a worker dies hard: the supervisor starts a new process in its slot (same worker id, new pid)
        before = wait_for(lambda: len(p := worker_pids_in_stats(serve)) == 2 and p, 10, what="2 workers in /stats")
        victim = serve.child_pids("worker")[0]
        victim_id = next(wid for wid, pid in before.items() if pid == victim)
        os.kill(victim, signal.SIGKILL)
        replacement = wait_for(
            lambda: (pids := serve.child_pids("worker")) and len(pids) == 2 and victim not in pids and pids,
            10,
            what="a replacement worker process",
        )
        new_pid = next(pid for pid in replacement if pid not in before.values())
        wait_for(lambda: worker_pids_in_stats(serve).get(victim_id) == new_pid, 10, what="the new pid in /stats")
        assert "restarting" in serve.log(tail=None)
        check_corpus_streams(serve)

        # scale at runtime: SIGTTIN adds a worker, SIGTTOU retires one
        serve.proc.send_signal(signal.SIGTTIN)
        wait_for(lambda: len(serve.child_pids("worker")) == 3, 10, what="a third worker process")
        wait_for(lambda: len(worker_pids_in_stats(serve)) == 3, 10, what="3 workers in /stats")
        serve.proc.send_signal(signal.SIGTTOU)
        wait_for(lambda: len(serve.child_pids("worker")) == 2, 10, what="back to 2 worker processes")
        assert complete(serve, "after scaling")["choices"][0]["text"]

        # SIGTERM: every child exits within 5 s, the runtime dir and its ipc files are gone, exit code 0
        pids = list(serve.children())
        serve.proc.send_signal(signal.SIGTERM)
        for pid in pids:
            wait_for(lambda pid=pid: not pid_alive(pid), 5, what=f"child {pid} to exit")
        assert serve.proc.wait(timeout=10) == 0
        assert not serve.runtime_dir.exists()
        assert list(serve.xdg_dir.iterdir()) == []


def test_other_tokenizer_json_logs_and_sigkilled_supervisor_leaves_no_orphans() -> None:
    tokenizer_dir = FIXTURE_TOKENIZER_DIRS["deepseek-v3"]
    with serving(
        "--workers", "1", "--log-format", "json", "--tokenizer", str(tokenizer_dir), "--source", "echo",
        "--step-interval-ms", "1",
    ) as serve:  # fmt: skip
        pids = list(serve.children())
        assert len(pids) == 3
        # --tokenizer reaches every process: the front encodes and the worker decodes with it (byte-level BPE, so
        # the echoed text is exactly the prompt's decode, with no SentencePiece leading-space question)
        tokenizer = load_fixture_tokenizer("deepseek-v3")
        prompt = "Hello 世界 😀 — echo"
        ids = tokenizer.encode(prompt, add_special_tokens=True).ids
        choice = complete(serve, prompt, max_tokens=100)["choices"][0]
        assert choice["text"] == tokenizer.decode(ids, skip_special_tokens=True)
        wait_for(lambda: serve.health() == 200 and "worker:" in serve.log(tail=None), 10, what="every process logging")
        records = [json.loads(line) for line in serve.log(tail=None).splitlines() if line.strip()]
        roles = {record["role"].split(":")[0] for record in records}
        assert roles == {"serve", "engine", "worker", "front"}
        assert {record["pid"] for record in records} == {serve.proc.pid, *pids}
        serve.proc.send_signal(signal.SIGKILL)
        serve.proc.wait(timeout=10)
        for pid in pids:
            wait_for(lambda pid=pid: not pid_alive(pid), 8, what=f"orphan {pid} to exit")
        assert serve.runtime_dir.exists()  # nobody could clean up ...
        fresh = make_runtime_dir(serve.xdg_dir)  # ... until the next `detok serve` starts
        assert not serve.runtime_dir.exists()
        assert fresh.exists() and (fresh / PID_FILE).read_text().strip() == str(os.getpid())
        shutil.rmtree(fresh)


def test_dead_engine_stops_the_service_with_exit_code_1() -> None:
    with serving("--workers", "1") as serve:
        pids = list(serve.children())
        (engine,) = serve.child_pids("engine")
        os.kill(engine, signal.SIGKILL)
        assert serve.proc.wait(timeout=15) == 1
        assert all(not pid_alive(pid) for pid in pids)
        assert "engine exited" in serve.log()
        assert list(serve.xdg_dir.iterdir()) == []


def test_sweep_keeps_dirs_of_live_supervisors_and_foreign_dirs(tmp_path: Path) -> None:
    live = tmp_path / f"{RUNTIME_DIR_PREFIX}live"
    live.mkdir()
    (live / PID_FILE).write_text(str(os.getpid()))
    unrelated = tmp_path / f"{RUNTIME_DIR_PREFIX}nopidfile"
    unrelated.mkdir()
    other = tmp_path / "not-ours"
    other.mkdir()
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    dead = tmp_path / f"{RUNTIME_DIR_PREFIX}dead"
    dead.mkdir()
    (dead / PID_FILE).write_text(dead_pid)
    assert sweep_stale_runtime_dirs(tmp_path) == [dead]
    assert live.exists() and unrelated.exists() and other.exists()


def test_startup_failure_exits_nonzero_and_cleans_up(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "detok_worker.cli", "serve", "--port", "0", "--tokenizer", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert result.returncode == 1
    assert "startup failed" in result.stderr
    assert "serving at" not in result.stdout
    assert list(tmp_path.iterdir()) == []
