"""A real vLLM engine on CPU for the tests: vLLM's own virtualenv (made by tests/vllm_cpu/install.sh, which the
README's test command runs), a 2-layer Qwen3 with random weights (`--load-format dummy`; the config in
tests/vllm_cpu/) and the embedded Qwen3 tokenizer. Seeded sampling at temperature 1 gives varied ids, partial
UTF-8 pieces and CJK; the same seed gives the same ids on every engine start.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import lzma
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from helpers.fixtures import FIXTURE_TOKENIZER_DIRS
from helpers.front_harness import free_port
from helpers.serve_helpers import REPO, ServeProcess, serving, wait_for

VENV = Path(os.environ.get("DETOK_VLLM_VENV", REPO / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
MODEL_CONFIG_DIR = REPO / "tests" / "vllm_cpu"
SERVED_NAME = "qwen3-tiny"
MAX_MODEL_LEN = 2048
# `vllm serve` engine flags, the same for vLLM's own server and for detok's vLLM source
ENGINE_FLAGS = (
    "--load-format", "dummy", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--dtype", "bfloat16",
    "--max-num-seqs", "512", "--served-model-name", SERVED_NAME,
    # vLLM's CPU default step budget splits prompts under a burst, and a split seeded prompt kills vLLM 0.32's CPU
    # engine core ("CPU Generator does not use offset"); a budget above any burst's prompt tokens keeps them whole
    "--max-num-batched-tokens", "8192",
)  # fmt: skip
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
# vLLM's stats line every second instead of every 10 (VLLM_LOG_STATS_INTERVAL): a short run logs it too
LOG_EVERY_SECOND = {"VLLM_LOG_STATS_INTERVAL": "1"}
STATS_LINE = "Avg prompt throughput"
# Qwen3-0.6B's generation_config.json sampling defaults
QWEN3_SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
# engine_stub's model-free vLLM worker (`--worker-cls`; it needs engine_stub importable: PYTHONPATH) and the
# variable that sets its step time
MODEL_FREE_WORKER = "engine_stub.vllm_worker.ModelFreeWorker"
MODEL_FREE_STEP_ENV = "DETOK_MODEL_FREE_STEP_MS"
STARTUP_TIMEOUT_S = 300.0  # an engine start is ~30 s here; under a loaded CI much longer


def require_venv() -> Path:
    """vLLM's interpreter; a missing one fails the test with the command that makes it (never a skip)."""
    if not PYTHON.is_file():
        raise AssertionError(
            f"no vLLM virtualenv at {VENV}: run `bash tests/vllm_cpu/install.sh` (README test command)"
        )
    return PYTHON


@cache
def model_dir() -> Path:
    """The random-weight model: its config, generation config and the embedded Qwen3 tokenizer files."""
    directory = Path(tempfile.mkdtemp(prefix="detok-vllm-model-"))
    for name in ("config.json", "generation_config.json"):
        shutil.copy(MODEL_CONFIG_DIR / name, directory / name)
    tokenizer_dir = FIXTURE_TOKENIZER_DIRS["qwen3"]
    shutil.copy(tokenizer_dir / "tokenizer_config.json", directory / "tokenizer_config.json")
    (directory / "tokenizer.json").write_bytes(lzma.decompress((tokenizer_dir / "tokenizer.json.xz").read_bytes()))
    return directory


def model_with_sampling_defaults() -> Path:
    """The model with a generation config that carries sampling defaults, as real models' do (Qwen3-0.6B's)."""
    directory = Path(tempfile.mkdtemp(prefix="detok-vllm-model-"))
    for path in model_dir().iterdir():
        shutil.copy(path, directory / path.name)
    generation = json.loads((directory / "generation_config.json").read_text())
    generation.update(QWEN3_SAMPLING_DEFAULTS)
    (directory / "generation_config.json").write_text(json.dumps(generation))
    return directory


# One vLLM interpreter for the test session's scripts (importing vLLM takes seconds): it runs each script as
# `python -c` would, with its arguments and input, and answers with what the script printed (vLLM's log lines
# go around it, on the same output, so the answer is one marked line).
_RESULT_MARK = "\x1edetok-vllm-script-result "
_SCRIPT_RUNNER = f"""
import contextlib, io, json, sys, traceback
answers = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    printed = io.StringIO()
    sys.argv = ["-c", *request["argv"]]
    requests, sys.stdin = sys.stdin, io.StringIO(request["input"])
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(request["script"], "<vllm script>", "exec"), {{"__name__": "__main__"}})
        answer = {{"printed": printed.getvalue()}}
    except BaseException:
        answer = {{"error": traceback.format_exc()}}
    finally:
        sys.stdin = requests
    answers.write({_RESULT_MARK!r} + json.dumps(answer) + "\\n")
    answers.flush()
"""


class _VllmInterpreter:
    def __init__(self) -> None:
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-scripts-", suffix=".log")[1])
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(require_venv()), "-c", _SCRIPT_RUNNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True, cwd=REPO, env={**os.environ, **ENV, "PYTHONPATH": str(REPO)},
            )  # fmt: skip
        atexit.register(self.proc.kill)

    def run(self, script: str, args: list[str], stdin: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"script": script, "argv": args, "input": stdin}) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(_RESULT_MARK):
                answer = json.loads(line[len(_RESULT_MARK) :])
                assert "error" not in answer, answer["error"][-3000:]
                return str(answer["printed"])
        raise AssertionError(f"vLLM's interpreter exited: {self.log_path.read_text(errors='replace')[-3000:]}")


@cache
def _vllm_interpreter() -> _VllmInterpreter:
    return _VllmInterpreter()


def run_vllm_script(script: str, args: list[str], stdin: str = "") -> str:
    """What `python -c script *args` printed in vLLM's virtualenv with `stdin` as its input, run by the session's
    one vLLM interpreter; a script that raises fails the test with its traceback."""
    return _vllm_interpreter().run(script, [str(arg) for arg in args], stdin)


# a PEFT LoRA adapter for the model (rank 8 on every layer's attention output), random, made with vLLM's torch
_MAKE_ADAPTER = """
import json, sys, torch
from safetensors.torch import save_file
config = json.load(open(sys.argv[1] + "/config.json"))
hidden, width = config["hidden_size"], config["num_attention_heads"] * config["head_dim"]
generator = torch.Generator().manual_seed(0)
tensors = {}
for layer in range(config["num_hidden_layers"]):
    name = f"base_model.model.model.layers.{layer}.self_attn.o_proj"
    tensors[name + ".lora_A.weight"] = torch.randn(8, width, generator=generator).to(torch.bfloat16)
    tensors[name + ".lora_B.weight"] = torch.randn(hidden, 8, generator=generator).to(torch.bfloat16)
save_file(tensors, sys.argv[2] + "/adapter_model.safetensors")
adapter = {"r": 8, "lora_alpha": 16, "target_modules": ["o_proj"], "peft_type": "LORA", "bias": "none",
           "task_type": "CAUSAL_LM", "base_model_name_or_path": sys.argv[1]}
json.dump(adapter, open(sys.argv[2] + "/adapter_config.json", "w"))
"""


@cache
def lora_adapter() -> Path:
    """A LoRA adapter directory for the model (vLLM's `--lora-modules NAME=PATH`)."""
    directory = Path(tempfile.mkdtemp(prefix="detok-vllm-lora-"))
    subprocess.run([str(require_venv()), "-c", _MAKE_ADAPTER, str(model_dir()), str(directory)], check=True)
    return directory


def detok_vllm(
    *extra: str,
    workers: int = 2,
    engine_flags: tuple[str, ...] = (),
    model: Path | None = None,
    env: dict[str, str] | None = None,
) -> contextlib.AbstractContextManager[ServeProcess]:
    """`serving` a `detok serve --source vllm` on the model, run by vLLM's interpreter. `engine_flags`: more
    `vllm serve` flags after ENGINE_FLAGS (a later one wins); `env`: more variables."""
    return serving(
        "--source", "vllm", "--model", str(model or model_dir()), "--workers", str(workers),
        "--startup-timeout", str(STARTUP_TIMEOUT_S), *extra, "--", *ENGINE_FLAGS, *engine_flags,
        timeout=60, startup_timeout=STARTUP_TIMEOUT_S, python=str(require_venv()), env={**ENV, **(env or {})},
    )  # fmt: skip


class VllmServer:
    """vLLM's own OpenAI server (`vllm serve`) on the same model and engine flags: the peer detok is compared with."""

    def __init__(self, *flags: str, model: Path | None = None, env: dict[str, str] | None = None) -> None:
        """`flags`: more `vllm serve` flags after ENGINE_FLAGS (a later one wins); `env`: more variables."""
        python = require_venv()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-serve-", suffix=".log")[1])
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [str(python.parent / "vllm"), "serve", str(model or model_dir()), *ENGINE_FLAGS, *flags,
                 "--host", "127.0.0.1", "--port", str(self.port)],
                env=dict(os.environ, **ENV, **(env or {})), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        try:
            wait_for(self._ready, STARTUP_TIMEOUT_S, interval=0.5, what="vllm serve")
        except AssertionError as exc:
            self.stop()
            log = self.log_path.read_text(errors="replace")[-4000:]
            raise AssertionError(f"vllm serve did not start; log:\n{log}") from exc

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"vllm serve exited: {self.log_path.read_text(errors='replace')[-4000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2.0) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        time.sleep(0.5)  # its engine core leaves after it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


# the reference server's batch: small enough that a load of 50 streams has some waiting (vllm:num_requests_waiting)
REFERENCE_MAX_NUM_SEQS = 16


@contextlib.contextmanager
def vllm_server(*flags: str, model: Path | None = None, env: dict[str, str] | None = None) -> Iterator[VllmServer]:
    server = VllmServer(*flags, model=model, env=env)
    try:
        yield server
    finally:
        server.stop()
