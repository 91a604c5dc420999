#!/usr/bin/env bash
# Prepare what benchmarks/gpu_check.sh installs on a bare GPU machine that has Python and a
# CUDA build of torch but not this project's dependencies, and no network: CPython wheels
# (manylinux, x86_64) of the runtime dependencies plus a wheel of this checkout, in
# gpu-wheels/ (ignored by git; carried to the machine beside the tree).
#   benchmarks/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-3.12}"
ABI="cp${PY/./}"
DEST=gpu-wheels
rm -rf "$DEST" && mkdir -p "$DEST"
# The package's own requirements (pyproject [project] dependencies) and what they pull, plus
# safetensors (the example saves with it) and pytest for the GPU suite.
python3 -m pip download -q --only-binary=:all: --dest "$DEST" \
  --python-version "$PY" --implementation cp --abi "$ABI" --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  'pydantic>=2.12,<3' pydantic-core annotated-types typing-inspection typing-extensions \
  'blake3>=0.4' 'rfc8785>=0.1.4' 'rich>=13' markdown-it-py mdurl pygments 'nvidia-ml-py>=12' \
  'safetensors>=0.4' pytest iniconfig pluggy packaging
python3 -m pip wheel -q --no-deps --no-build-isolation --wheel-dir "$DEST" . 2>/dev/null \
  || python3 -m pip wheel -q --no-deps --wheel-dir "$DEST" .
ls "$DEST"
