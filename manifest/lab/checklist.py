"""The lab's checklist: what a run's manifest says about each thing that can change the bits.

Six categories (code, data, env, random state, hardware, numerics), each
check read from the recipe run's manifest plus what the runs showed; a check
is ``pass``, ``warn`` (reproducible here, but something a second machine or
a reviewer cannot rebuild) or ``fail`` (the runs cannot be reproduced as
recorded), with one line on how to fix it.
"""

from __future__ import annotations

from manifest.diff.overrides import reseed_notes
from manifest.judge import LabOutcome
from manifest.lab.report import Check, ModeResult
from manifest.models import Flags, Manifest


def _flags(m: Manifest) -> Flags | None:
    det = m.determinism
    for p in det.processes if det is not None else []:
        if p.flags is not None:
            return p.flags
    return None


def _code(m: Manifest) -> list[Check]:
    code = m.code
    if code.commit is None:
        clean = Check(category="code", name="clean tree", status="fail",
                      detail="not a git repository: the code cannot be named by a commit",
                      fix="git init && git add -A && git commit")
    elif code.dirty:
        clean = Check(category="code", name="clean tree", status="warn",
                      detail=f"uncommitted changes ({code.untracked_files or 0} untracked "
                      "file(s)) are kept as a patch blob beside the manifest",
                      fix="commit the changes so the commit alone names the code")
    else:
        clean = Check(category="code", name="clean tree", status="pass",
                      detail=f"commit {code.commit[:12]}, no uncommitted changes")
    if code.lockfiles:
        lock = Check(category="code", name="lockfile", status="pass",
                     detail=", ".join(sorted(code.lockfiles)))
    else:
        lock = Check(category="code", name="lockfile", status="warn",
                     detail="no lockfile (uv.lock, poetry.lock, requirements*.txt, …)",
                     fix="commit a lockfile, e.g. uv lock or pip freeze > requirements.txt")
    return [clean, lock]


def _data(m: Manifest) -> list[Check]:
    if not m.data:
        return [Check(category="data", name="declared and digested", status="warn",
                      detail="no dataset declared: data the script reads is not in the run_id",
                      fix="manifest lab --data PATH (or data = [...] in [tool.manifest])")]
    names = ", ".join(f"{d.name} ({d.files} files)" for d in m.data)
    return [Check(category="data", name="declared and digested", status="pass",
                  detail=f"blake3 Merkle roots for {names}")]


def _env(m: Manifest) -> list[Check]:
    env = m.env
    image = env.container.image_digest
    container = (Check(category="env", name="container digest", status="pass", detail=image)
                 if image else
                 Check(category="env", name="container digest", status="warn",
                       detail="no container image digest: the system libraries are not named",
                       fix="run in an image pinned by digest (image@sha256:…)"))
    torch_line = f"torch {env.torch}" if env.torch else "torch not seen"
    versions = Check(category="env", name="versions recorded", status="pass",
                     detail=f"python {env.python}, {torch_line}, {len(env.packages)} packages "
                     "digested")
    if env.torch is None:
        versions = Check(category="env", name="versions recorded", status="warn",
                         detail="torch version not recorded",
                         fix="install torch in the environment the command runs in")
    return [container, versions]


def _random(m: Manifest, recipe: ModeResult) -> list[Check]:
    rnd = m.randomness
    det = m.determinism
    seeded = [p for p in rnd.processes if p.seed is not None] if rnd is not None else []
    reseeded = reseed_notes(m)
    checks = [
        Check(category="random state", name="seeded", status="pass",
              detail=f"seed {rnd.seed if rnd else None} from the launcher in {len(seeded)} "
              "process(es): python, numpy, torch CPU and CUDA"
              + "".join(f"; {note}" for note in reseeded[:2])
              + (f"; and {len(reseeded) - 2} more seeding call(s)" if len(reseeded) > 2
                 else ""))
        if seeded else
        Check(category="random state", name="seeded", status="fail",
              detail="no Python process was seeded by the launcher",
              fix="run a Python command (python -I/-S skip the launcher)"),
    ]
    hashseed = [p.pythonhashseed for p in det.processes] if det is not None else []
    if hashseed and all(h is not None for h in hashseed):
        checks.append(Check(category="random state", name="PYTHONHASHSEED", status="pass",
                            detail=f"in force from interpreter start ({hashseed[0]})"))
    else:
        checks.append(Check(category="random state", name="PYTHONHASHSEED", status="warn",
                            detail="not in force in every process: set and dict order of "
                            "str keys can change from run to run",
                            fix="export PYTHONHASHSEED=0 before python starts"))
    loaders = [loader for p in (rnd.processes if rnd is not None else [])
               for loader in p.loaders or []]
    if not loaders:
        checks.append(Check(category="random state", name="DataLoader workers", status="pass",
                            detail="not used: the run started no DataLoader with worker "
                            "processes"))
        if recipe.outcome != LabOutcome.NOTHING_COMPARED and not recipe.bit_identical:
            checks.append(Check(category="random state", name="unseeded source",
                                status="warn",
                                detail="the recipe runs differ with no DataLoader worker to "
                                "blame: something no seed reaches feeds the run (os.urandom, "
                                "a clock, an unseeded generator of another library)",
                                fix="manifest explain names the first op and line where the "
                                "runs part"))
    elif recipe.outcome == LabOutcome.NOTHING_COMPARED:
        checks.append(Check(category="random state", name="DataLoader workers", status="warn",
                            detail="not known: the runs compared nothing",
                            fix="manifest lab --artifact PATH (the weights file the script "
                                "writes)"))
    elif recipe.bit_identical:
        sites = sorted({loader.site for loader in loaders})
        checks.append(Check(category="random state", name="DataLoader workers", status="pass",
                            detail=f"{len(loaders)} iterator(s) with workers "
                            f"({', '.join(sites[:3])}); runs agree: under the launcher "
                            "torch seeds each worker from the seeded generator"))
    else:
        checks.append(Check(category="random state", name="DataLoader workers", status="warn",
                            detail="the recipe runs differ: a worker or another generator may "
                            "be unseeded",
                            fix="DataLoader(..., **manifest.dataloader_kwargs(seed))"))
    return checks


def _hardware(m: Manifest, threads: int) -> list[Check]:
    hw = m.hardware
    if hw.gpus:
        names = sorted({g.name for g in hw.gpus})
        sku = Check(category="hardware", name="SKU recorded", status="pass",
                    detail=f"{hw.gpu_count}× {', '.join(names)}; CPU {hw.cpu_model}")
    else:
        sku = Check(category="hardware", name="SKU recorded", status="warn",
                    detail=f"no GPU here (CPU {hw.cpu_model}): CUDA kernels were not measured",
                    fix="run the lab on the GPU the training uses")
    pinned = m.determinism.num_threads if m.determinism is not None else None
    thread_check = (
        Check(category="hardware", name="thread count", status="pass",
              detail=f"{pinned} threads pinned (another count changes the bits on CPU)")
        if pinned == threads else
        Check(category="hardware", name="thread count", status="fail",
              detail=f"thread count {pinned} not the pinned {threads}",
              fix="manifest lab --threads N")
    )
    return [sku, thread_check]


def _numerics(m: Manifest, default: ModeResult) -> list[Check]:
    flags = _flags(m)
    if flags is None:
        return [Check(category="numerics", name="flags", status="fail",
                      detail="torch was never imported: no flag was recorded",
                      fix="make sure the command runs the training in Python")]
    tf32 = bool(flags.allow_tf32_matmul or flags.allow_tf32_cudnn)
    checks = [
        Check(category="numerics", name="TF32", status="warn" if tf32 else "pass",
              detail=("TF32 allowed at exit (matmul "
                      f"{flags.allow_tf32_matmul}, cuDNN {flags.allow_tf32_cudnn})") if tf32
              else "off (float32 matmul precision "
                   f"{flags.float32_matmul_precision or 'highest'})",
              fix="remove the script's allow_tf32 = True, or keep it and record it" if tf32
              else None),
        Check(category="numerics", name="AMP", status="warn" if flags.autocast else "pass",
              detail="autocast was active at exit" if flags.autocast else "no autocast at exit",
              fix="reduced precision is repeatable, but a different GPU changes its bits"
              if flags.autocast else None),
    ]
    from manifest.nodes.topology import collective_problems, collective_summary

    collectives = collective_summary(m)
    if collectives is not None:
        problems = collective_problems(m)
        checks.append(Check(category="numerics", name="collectives",
                            status="warn" if problems else "pass",
                            detail=collectives + (f"; {problems[0]}" if problems else ""),
                            fix="export NCCL_ALGO=Ring (or Tree) before the run"
                            if problems else None))
    if flags.deterministic_algorithms and not flags.deterministic_warn_only:
        checks.append(Check(category="numerics", name="deterministic switch", status="pass",
                            detail="use_deterministic_algorithms(True), cuDNN deterministic, "
                            "benchmark off" + ("; default runs differ without it"
                                               if not default.bit_identical else "")))
    else:
        checks.append(Check(category="numerics", name="deterministic switch", status="fail",
                            detail="the script turned use_deterministic_algorithms off (or to "
                            "warn only) under the recipe",
                            fix="remove the script's own use_deterministic_algorithms call"))
    return checks


def _compared(recipe: ModeResult) -> Check:
    """What the runs were compared on: a verdict that compared nothing is flagged."""
    if recipe.basis == "nothing":
        return Check(category="numerics", name="compared", status="fail",
                     detail="nothing was compared: no output declared or written, no "
                     "optimizer step seen, so 'the runs agree' would mean nothing",
                     fix="manifest lab --artifact PATH (the weights file the script writes)")
    if recipe.basis == "trail":
        return Check(category="numerics", name="compared", status="warn",
                     detail=f"the step trail only ({recipe.runs[0].trail_steps} steps): one "
                     "bit-sum per parameter per step, not the weights' bytes",
                     fix="manifest lab --artifact PATH to compare the weights tensor by tensor")
    return Check(category="numerics", name="compared", status="pass",
                 detail=f"{recipe.basis_text} ({recipe.tensors_compared} tensors)")


def checklist(m: Manifest, *, threads: int, default: ModeResult,
              recipe: ModeResult) -> list[Check]:
    """Every check, category by category, for the recipe run ``m``."""
    return [*_code(m), *_data(m), *_env(m), *_random(m, recipe), *_hardware(m, threads),
            *_numerics(m, default), _compared(recipe)]
