"""A non-editable install (what README's first command does) works from any directory: it finds the default
config, the embedded tokenizer, the corpus source's passages and the bench scripts, all shipped as package data."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.fixtures import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv holding a wheel of this checkout (its dependencies come from the test environment)."""
    root = tmp_path_factory.mktemp("installed")
    wheels, venv = root / "wheels", root / "venv"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, REPO],
        check=True,
        cwd=root,
        capture_output=True,
    )
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    # the dependencies: this environment's site-packages as plain path entries (its .pth files, among them an
    # editable install of this checkout, are not run); --system-site-packages would give the base interpreter's,
    # which hold nothing in a fresh virtualenv
    where = [venv / "bin" / "python", "-c", "import site; print(site.getsitepackages()[0])"]
    venv_site = Path(subprocess.run(where, check=True, capture_output=True, text=True).stdout.strip())
    (venv_site / "test-environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    (wheel,) = wheels.glob("detok-*.whl")
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", wheel]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(pip, check=True, capture_output=True, env=env)
    yield venv / "bin"


def run_installed(bin_dir: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([bin_dir / "detok", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_the_installed_package_is_not_this_checkout(installed: Path, tmp_path: Path) -> None:
    code = "import detok_worker, sys; print(detok_worker.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([installed / "python", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert "site-packages" in result.stdout and str(REPO) not in result.stdout, result.stdout


def test_config_reads_the_shipped_default(installed: Path, tmp_path: Path) -> None:
    result = run_installed(installed, "config", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "[engine]" in result.stdout and 'source = "corpus"' in result.stdout


def test_the_corpus_source_reads_the_shipped_corpus(installed: Path, tmp_path: Path) -> None:
    code = "from engine_stub.planned import load_corpus; print(len(load_corpus()))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([installed / "python", "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 0


def test_bench_runs_a_shipped_script(installed: Path, tmp_path: Path) -> None:
    out = tmp_path / "core.json"
    result = run_installed(installed, "bench", "core", "--quick", "--json", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    families = {row["tokenizer"] for row in json.loads(out.read_text())["results"]}
    assert "qwen3" in families  # the embedded tokenizer; fixture families are skipped outside a checkout


def test_serve_answers_on_the_embedded_tokenizer(installed: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    port_file = tmp_path / "port"
    with subprocess.Popen(
        [installed / "detok", "serve", "--port", "0", "--workers", "1", "--source", "echo"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as serve:
        try:
            url = None
            deadline = time.monotonic() + 120
            while url is None and time.monotonic() < deadline:
                line = serve.stdout.readline() if serve.stdout else ""
                if "serving at " in line:
                    url = line.split("serving at ")[1].split()[0]
            assert url, "detok serve did not come up"
            port_file.write_text(url)
            body = json.dumps({"prompt": "Grüße, 世界 🙂", "max_tokens": 40}).encode()
            request = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=60) as reply:
                text = json.loads(reply.read())["choices"][0]["text"]
            assert text == "Grüße, 世界 🙂"  # the echo source streams the prompt's own ids back
        finally:
            serve.terminate()
            serve.wait(timeout=30)
