#!/usr/bin/env bash
# The GPU check in one command, on a bare GPU machine: Python 3 and a CUDA build of torch,
# no network. Installs this project from the wheels benchmarks/gpu_wheels.sh prepared
# (gpu-wheels/, carried beside the tree) into an environment of its own that still sees the
# machine's torch, then runs the `gpu` tests and the bundled example end to end, and
# writes one log: $OUT/gpu_check.log (OUT defaults to ./gpu-check-out).
#   benchmarks/gpu_wheels.sh 3.12      # here, with the network
#   benchmarks/gpu_check.sh            # there (or with pytest node ids: only those)
# Exit status: pytest's, or the example's if the tests passed and it failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
exec > >(tee "$LOG") 2>&1
say() { printf '\n== %s\n' "$*"; }

say "machine"
date -u; uname -srm
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true

say "install (offline, from gpu-wheels/)"
VENV="${MANIFEST_GPU_VENV:-/tmp/manifest-gpu-venv}"
rm -rf "$VENV"
# The interpreter whose torch is the machine's CUDA build: $PYTHON, else the first of these
# that imports torch (it may live in a venv or conda of its own).
PY=""
for cand in ${PYTHON:-} python3 python python3.12 python3.11 /usr/local/bin/python3 \
            /usr/bin/python3 /opt/*/bin/python3 /opt/conda/bin/python /root/.venv/bin/python \
            /venv/bin/python /workspace/.venv/bin/python; do
  command -v "$cand" >/dev/null 2>&1 && "$cand" -c "import torch" 2>/dev/null \
    && { PY="$(command -v "$cand")"; break; }
done
[ -n "$PY" ] || { echo "no Python here imports torch (set PYTHON=...)"; exit 2; }
echo "torch's interpreter: $PY"
"$PY" -m venv --system-site-packages "$VENV" || exit 2
# The machine's torch stays the one used (never replaced): its site directory is put on the
# new environment's path, wherever it lives.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
  > "$SITE/zz_machine_torch.pth"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
ls gpu-wheels/*.whl >/dev/null 2>&1 || { echo "no gpu-wheels/: run benchmarks/gpu_wheels.sh"; exit 2; }
python -m pip install -q --no-index --no-deps gpu-wheels/*.whl || exit 2
python - <<'PY' || exit 2
import importlib.metadata as md, torch, manifest
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
print("torch-manifest", md.version("torch-manifest"), "from", manifest.__file__)
PY

say "GPU suite (pytest -m gpu)"
# Run from a copy of tests/ outside the tree, so `manifest` is the installed wheel.
SUITE="$(mktemp -d)/suite"; mkdir -p "$SUITE"
cp -r tests pyproject.toml examples "$SUITE"/
# Only the files that hold gpu tests are collected: the rest need the dev extras.
FILES=$(cd "$SUITE" && grep -l "mark.gpu" tests/test_*.py)
MARK="-m gpu"
# A re-check of some (benchmarks/gpu_check.sh tests/x.py::test_y): those, marked gpu or not.
[ "$#" -gt 0 ] && { FILES="$*"; MARK=""; }
(cd "$SUITE" && python -m pytest -v -p no:cacheprovider $MARK -rA --durations=0 \
   -W ignore::DeprecationWarning -W ignore::UserWarning -W ignore::FutureWarning $FILES)
rc=$?

if [ "${GPU_CHECK_EXAMPLE:-1}" = 0 ]; then say "result: gpu suite exit $rc"; exit "$rc"; fi
say "bundled example: capture, capture again, verify"
EX="$(mktemp -d)/example"; mkdir -p "$EX"
cp examples/train.py "$EX/"
(
  cd "$EX" && set -e
  git init -q -b main && printf 'out/\n*.json\n' > .gitignore
  git add -A && git -c user.name=gpu -c user.email=gpu@example.invalid commit -q -m example
  manifest capture --seed 0 --artifact 'out/*.safetensors' -- python train.py > a.json
  manifest capture --seed 0 --artifact 'out/*.safetensors' -- python train.py > b.json
  python -c "import json,sys; a,b=(json.load(open(f)) for f in ('a.json','b.json')); print('run_id a', a['run_id']); print('run_id b', b['run_id']); sys.exit(a['run_id']!=b['run_id'])"
  manifest verify a.json
  cp a.json b.json "$OUT/"
)
ex=$?
say "result: gpu suite exit $rc, example exit $ex"
[ "$rc" -ne 0 ] && exit "$rc"
exit "$ex"
