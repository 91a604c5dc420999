#!/usr/bin/env bash
# The main job on the bundled example, offline on CPU: capture two runs
# (seeds 1 and 2), verify the first bit for bit, diff the two.
set -euo pipefail
cd "$(dirname "$0")/.."
# The manifests are kept (in a fresh temporary directory, named at the end) so
# `manifest show` / `manifest diff` work on them after the demo.
work=$(mktemp -d "${TMPDIR:-/tmp}/manifest-demo.XXXXXX")
echo "== capture (seed 1)" >&2
manifest capture --seed 1 --artifact 'out/*.safetensors' -- python examples/train.py > "$work/seed1.json"
echo "== verify" >&2
manifest verify "$work/seed1.json"
echo "== capture (seed 2)" >&2
manifest capture --seed 2 --artifact 'out/*.safetensors' -- python examples/train.py > "$work/seed2.json"
echo "== diff" >&2
status=0
manifest diff "$work/seed1.json" "$work/seed2.json" || status=$?
# Exit 1 means "a difference that can change bits": expected for two seeds.
test "$status" -eq 1
echo "demo ok: verify identical, diff found the seed change" >&2
echo "manifests kept: $work/seed1.json $work/seed2.json (try: manifest show $work/seed1.json)" >&2
