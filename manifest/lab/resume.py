"""``manifest lab --resume-at K``: does resuming at step K give the uninterrupted run?

Megatron-LM's determinism contract lists "restart replay" as a gate; this is
that gate for any script with a resume path. Three runs of the command, in
place, under the recipe, through the re-run engine like every lab run:

1. **stop at K**: the command as typed, ended by the launcher before it would
   take step K+1 (``MANIFEST_SEGMENT``), after the script saved its
   checkpoint of step K (it must save one then: the launcher's record says
   which file, ``launch/boot/_manifest_checkpoints``);
2. **resumed**: the command plus the resume template with that checkpoint,
   its steps numbered from K;
3. **uninterrupted**: the command as typed.

Runs 2 and 3 fingerprint, before every optimizer step after K, what the step
depends on (``MANIFEST_RESUME_PROBE``: parameters, gradients, optimizer state,
its hyperparameters, the global generators). The step trails of 2 and 3 are
compared exactly. At the first step where they part, the probes of that step
name the state the checkpoint did not carry, in the order a step uses it:

* parameters differ: the model's weights were not restored;
* the optimizer's state: momentum or Adam moments;
* its hyperparameters: the LR scheduler (or whatever sets ``lr``) was not;
* a global generator (python, numpy, torch CPU, CUDA): that RNG state;
* only the gradients: the data the step saw, i.e. the sampler's position or
  its epoch seed, or the DataLoader workers' generators;
* none of these: state the audit cannot see, named by its step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.errors import NoVerdictError, UsageError
from manifest.launch.boot._manifest_wire import PROBE_VAR, SEGMENT_VAR, Probe, ProcessRecord

if TYPE_CHECKING:
    from manifest.rerun.plan import RerunOptions, RerunPlan

_RNG_NAMES = {"python": "python's random", "numpy": "numpy's global", "torch_cpu": "torch's CPU",
              "cuda": "the CUDA"}


@dataclass
class ResumeAudit:
    command: list[str]
    at: int
    checkpoint: str
    resumed_command: list[str]
    steps_compared: int = 0
    first_divergent_step: int | None = None
    forgotten: list[str] = field(default_factory=list)
    """What the checkpoint did not carry (empty when resuming is bit-identical)."""
    detail: str | None = None

    @property
    def identical(self) -> bool:
        return self.first_divergent_step is None and self.steps_compared > 0

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "at": self.at, "checkpoint": self.checkpoint,
                "resumed_command": self.resumed_command, "identical": self.identical,
                "steps_compared": self.steps_compared,
                "first_divergent_step": self.first_divergent_step,
                "forgotten": self.forgotten, "detail": self.detail}


def _trail(records: list[ProcessRecord]) -> dict[int, dict[int, str]]:
    out: dict[int, dict[int, str]] = {}
    for r in records:
        points = r.get("trail") or r.get("auto_trail") or []
        if points:
            out[int(r.get("rank") or 0)] = {int(p["step"]): str(p["digest"]) for p in points}
    return out


def _probes(records: list[ProcessRecord]) -> dict[int, Probe]:
    for r in records:
        if r.get("probes"):
            return {int(p["step"]): p for p in r["probes"]}
    return {}


def _checkpoint_at(records: list[ProcessRecord], step: int, cwd: Path) -> str:
    saved = [c for r in records for c in r.get("checkpoints") or [] if c.get("step") == step]
    if not saved:
        found = sorted({int(c["step"]) for r in records for c in r.get("checkpoints") or []})
        raise UsageError(f"the command saved no checkpoint at step {step}"
                         + (f" (it saved at steps {', '.join(map(str, found[:10]))})"
                            if found else " (it saved none the launcher saw)") + ".",
                         hint="Choose --resume-at at a step where the script saves.")
    return os.path.relpath(saved[-1]["path"], cwd)


def _show(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def name_forgotten(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """What differs between two probes of one step, uninterrupted (a) and resumed (b)."""
    if a.get("params") != b.get("params"):
        return ["the model's weights (the checkpoint did not restore them)"]
    if a.get("optimizer_state") != b.get("optimizer_state"):
        return ["the optimizer's state (momentum or Adam moments)"]
    if a.get("hyper") != b.get("hyper"):
        parts = []
        for i, (ga, gb) in enumerate(zip(a.get("hyper") or [], b.get("hyper") or [],
                                         strict=False)):
            for key in sorted(set(ga) | set(gb)):
                if ga.get(key) != gb.get(key):
                    parts.append(f"group {i} {key} {_show(ga.get(key))} → {_show(gb.get(key))}")
        return [f"the LR scheduler ({'; '.join(parts[:3])})"]
    ra, rb = a.get("rng") or {}, b.get("rng") or {}
    rngs = [f"{_RNG_NAMES[k]} RNG state" for k in _RNG_NAMES if ra.get(k) != rb.get(k)]
    if rngs:
        return rngs
    if a.get("grads") != b.get("grads"):
        return ["the data the step saw: the sampler's position or its epoch seed (or the "
                "DataLoader workers' RNG)"]
    return []


def resume_audit(cwd: Path, command: list[str], *, at: int, template: str | None,
                 seed: int, threads: int, rerun: RerunOptions,
                 progress: Callable[[str], None] | None = None,
                 show_plan: Callable[[RerunPlan], None] | None = None) -> ResumeAudit:
    from manifest.launch.runner import LaunchSettings
    from manifest.rerun.dispatch import executor_for
    from manifest.rerun.executor import confined_hint
    from manifest.rerun.plan import plan_command
    from manifest.rerun.workspace import open_workspace, repo_root_of
    from manifest.trust import TrustDecision
    from manifest.verify.conventions import NO_TEMPLATE, RESUME_VAR, resume_argv, resume_template

    say = progress or (lambda _: None)
    root = repo_root_of(cwd) or cwd
    resume = resume_template(root, template)
    settings = LaunchSettings(seed=seed, derivation="same", threads=threads, deterministic=True)
    plan = plan_command(
        verb="lab", root=root, argv=command, cwd=os.path.relpath(cwd, root), outputs=[],
        data=[], settings=settings,
        variables={"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)},
        options=replace(rerun, in_place=True),
        trust=TrustDecision(True, "the command you typed", "typed"),
        runs=(f"1 stopped after step {at}", "1 resumed from its checkpoint ("
              + (" ".join(resume) if resume else "a known convention: Lightning's ckpt_path")
              + ")",
              "1 uninterrupted"))
    if show_plan is not None:
        show_plan(plan)
    plan.require()
    executor = executor_for(plan)
    with open_workspace(plan, root) as workspace:
        run_settings = replace(settings, root=str(workspace.mount_at))

        def run(argv: list[str], extra: dict[str, str], what: str) -> list[ProcessRecord]:
            say(what)
            this = replace(plan, argv=tuple(argv))
            result = executor.run(this, workspace, run_settings, {**os.environ, **extra})
            if result.exit_code != 0:
                error = next((str(r["exception"]) for r in result.records
                              if r.get("exception")), f"exit status {result.exit_code}")
                raise NoVerdictError(f"the {what} failed: {error[:500]}{confined_hint(plan)}.")
            return result.records

        stopped = run(command, {SEGMENT_VAR: json.dumps({"stop_after": at})},
                      f"run 1: stopped after step {at}")
        checkpoint = _checkpoint_at(stopped, at, workspace.cwd)
        resumed_argv = resume_argv(command, resume, checkpoint)
        if resume is None:  # nanoGPT's init_from=resume: an argument, and no template
            from manifest.verify.conventions import resume_convention_argv

            resumed_argv = resume_convention_argv(workspace.cwd, command,
                                                  checkpoint) or resumed_argv
        probe = {PROBE_VAR: json.dumps({"from": at})}
        convention = {} if resume is not None else {RESUME_VAR: checkpoint}
        resumed = run(resumed_argv, {**probe, **convention,
                                     SEGMENT_VAR: json.dumps({"step_offset": at})},
                      f"run 2: resumed from {checkpoint}")
        if resume is None and not any(r.get("resumed_from") for r in resumed):
            raise UsageError(NO_TEMPLATE[0] + ".", hint=NO_TEMPLATE[1])
        whole = run(command, probe, "run 3: uninterrupted")
    audit = ResumeAudit(command=command, at=at, checkpoint=checkpoint,
                        resumed_command=resumed_argv)
    a, b = _trail(whole), _trail(resumed)
    for rank, points in sorted(a.items()):
        later = sorted(s for s in points if s > at)
        if rank == min(a):
            audit.steps_compared = len(later)
        for step in later:
            if b.get(rank, {}).get(step) != points[step]:
                if audit.first_divergent_step is None or step < audit.first_divergent_step:
                    audit.first_divergent_step = step
                break
    if audit.steps_compared == 0:
        audit.detail = f"the uninterrupted run recorded no optimizer step after step {at}"
    if audit.first_divergent_step is not None:
        pa, pb = _probes(whole), _probes(resumed)
        step = audit.first_divergent_step
        if step in pa and step in pb:
            audit.forgotten = name_forgotten(pa[step], pb[step])
        if not audit.forgotten:
            audit.forgotten = [f"state the audit cannot see (the runs part at step {step})"]
    return audit
