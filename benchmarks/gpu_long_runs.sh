#!/usr/bin/env bash
# The GPU twin of the long-run checks (issue 29), on a bare GPU machine with CUDA torch:
# a CUDA script (dropout, torch.randint on the GPU, Adam) captured with a checkpoint every
# 3 steps; verify --at 5,11 from its checkpoints; lab --resume-at 6, and again with the
# CUDA generator left out of the restore (the audit must name it). Needs the wheels of
# manifest's dependencies for the machine's Python in .whl/ (blake3, pydantic, pydantic_core,
# rfc8785, typing_inspection, annotated_types) and $OUT for the three JSON reports.
# Measured on an H100 (torch 2.11.0+cu130): segments identical, audit identical, and
# 'the CUDA RNG state' named at step 7.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
REPO=$PWD
python3 -c "import torch, manifest; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0))"
mkdir -p /tmp/g && cd /tmp/g && git init -q -b main
cat > cuda_job.py <<'PY'
import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--resume")
p.add_argument("--forget", default="")
p.add_argument("--steps", type=int, default=12)
a = p.parse_args()
dev = "cuda"
data, target = torch.randn(256, 32, device=dev), torch.randn(256, 4, device=dev)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Dropout(0.2),
                            torch.nn.Linear(64, 4)).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
step = 0
if a.resume:
    ck = torch.load(a.resume, weights_only=True)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    step = ck["step"]
    torch.set_rng_state(ck["cpu_rng"])
    if a.forget != "cuda":
        torch.cuda.set_rng_state(ck["cuda_rng"])
while step < a.steps:
    idx = torch.randint(0, 256, (32,), device=dev)
    loss = ((model(data[idx]) - target[idx]) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if step % 3 == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "cpu_rng": torch.get_rng_state(), "cuda_rng": torch.cuda.get_rng_state()},
                   f"ck-{step}.pt")
PY
printf '[tool.manifest]\nresume = "--resume {checkpoint}"\n' > pyproject.toml
printf 'ck-*\n*.json\n' > .gitignore
git add -A && git -c user.name=g -c user.email=g@g commit -qm job
M="python3 -m manifest"
time $M capture --seed 0 -- python3 cuda_job.py > run.json; echo "capture rc=$?"
python3 -c "import json; d=json.load(open('run.json')); print([(c['step'], c['path'], c['artifact']['format']) for c in d['outputs']['checkpoints']])"
time $M verify -q --at 5,11 --format json run.json > $OUT/segments.json; echo "segments rc=$?"
time $M lab -q --resume-at 6 --format json -- python3 cuda_job.py > $OUT/audit_ok.json; echo "audit ok rc=$?"
$M lab -q --resume-at 6 --format json -- python3 cuda_job.py --forget cuda > $OUT/audit_forget.json; echo "audit forget rc=$?"
cat $OUT/segments.json $OUT/audit_ok.json $OUT/audit_forget.json
