"""Human renderings (rich) of manifests and reports. Only the CLI calls these."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from manifest.cli.text import (
    folded_drift,
    make_console,
    markup,
    plain_confinement,
    plain_trust,
    shell_join,
)
from manifest.judge import Verdict
from manifest.models import Manifest, Outputs, RankRecording

if TYPE_CHECKING:
    from rich.console import Console

    from manifest.rerun.plan import RerunPlan
    from manifest.verify.report import Drift, VerifyReport


def _console(file: TextIO | None = None) -> Console:
    return make_console(file)


def show_rows(manifest: Manifest) -> list[tuple[str, str, str]]:
    """(section, fact, value) rows of ``manifest show``, in every format."""
    rows: list[tuple[str, str, str]] = []

    def add(section: str, fact: str, value: str) -> None:
        rows.append((section, fact, value))

    code = manifest.code
    add("code", "commit", code.commit or f"- ({code.unavailable.get('commit', '')})")
    add("", "dirty", str(code.dirty))
    if code.diff_digest:
        add("", "diff", code.diff_digest)
    for name, digest in code.lockfiles.items():
        add("", f"lockfile {name}", digest)
    for lock in manifest.observed.lockfile_disagrees or []:
        add("", f"{lock.lockfile} disagrees", f"{lock.package} pinned {lock.locked}, the run "
            f"used {lock.installed}")
    for ds in manifest.data:
        found = " discovered" if ds.source == "discovered" else ""
        if ds.remote is not None:
            pin = ds.remote
            kinds = ", ".join(f"{n} {kind}" for kind, n in pin.checksums.items())
            add("data", ds.name, f"{ds.path} {ds.root} ({ds.files} objects, {ds.bytes} bytes)")
            add("", f"{ds.name} pinned by", f"{pin.strength.replace('-', ' ')} ({pin.mode}; "
                f"{kinds}; {pin.versioned} versioned"
                + (f"; {'version' if pin.provider == 'delta' else 'commit'} {pin.revision}"
                   if pin.revision else "") + ")")
            continue
        add("data", ds.name, f"{ds.root} ({ds.files} files, {ds.bytes} bytes{found})")
    env = manifest.env
    add("env", "python", f"{env.implementation} {env.python}")
    add("", "torch", env.torch or "-")
    add("", "torch CUDA build", env.torch_cuda or "-")
    add("", "cuDNN / NCCL", f"{env.cudnn or '-'} / {env.nccl or '-'}")
    add("", "packages", f"{len(env.packages)} ({env.packages_digest})")
    if env.imported is not None:
        add("", "imported by the run", " ".join(env.imported) or "-")
    for key, value in env.variables.items():
        add("", key, value)
    hw = manifest.hardware
    gpus = ", ".join(g.name for g in hw.gpus) if hw.gpus else f"- ({hw.unavailable.get('gpus')})"
    add("hardware", "GPUs", gpus)
    add("", "CPU", hw.cpu_model or "-")
    add("", "ISA", " ".join(hw.cpu_isa) or "-")
    rnd, det = manifest.randomness, manifest.determinism
    add("randomness", "seed", "-" if rnd.seed is None else str(rnd.seed))
    for proc in rnd.processes:
        for call in proc.reseeds or []:
            drawn = f", after draws from {', '.join(call.drawn)}" if call.drawn else (
                ", before any draw" if call.generators else "")
            add("", f"rank {proc.rank} {call.site}", f"{call.call}({call.seed or ''}){drawn}")
        for loader in proc.loaders or []:
            add("", f"rank {proc.rank} {loader.site}",
                f"DataLoader base seed {loader.base_seed}, {loader.workers} workers")
    add("determinism", "enforced", str(det.requested))
    add("", "threads", "-" if det.num_threads is None else str(det.num_threads))
    for dproc in det.processes:
        for sw in dproc.switches or []:
            add("", f"rank {dproc.rank} {sw.site}", f"{sw.switch} = {sw.value}")
    if manifest.command:
        add("command", "argv", shell_join(list(manifest.command.argv)))
        from manifest.launch.runner import launch_identity

        add("", "launch id", launch_identity(
            code.commit, code.diff_digest, list(manifest.command.argv), rnd.seed or 0))
    if manifest.outputs:
        out = manifest.outputs
        add("outputs", "status", f"{out.status} (exit {out.exit_code})")
        for art in out.artifacts:
            n = len(art.tensors) if art.tensors is not None else 0
            add("", art.path, f"{art.format}, {n} tensors, {art.digest}")
        numeric = next((p.numeric for p in out.processes if p.numeric), None)
        if numeric:
            add("", "numeric trail", f"{len(numeric)} steps (to {numeric[-1].step}), "
                f"{len(numeric[0].groups)} parameter group(s)")
        costs = manifest.observed.recording or [  # older manifests keep it per outcome
            RankRecording(rank=o.rank, seconds=o.recording.seconds, share=o.recording.share)
            for o in out.processes if o.recording is not None]
        for cost in costs:
            add("", f"recording, rank {cost.rank}", f"{cost.share:.1%} of the process's time "
                f"({cost.seconds:.2f} s in the step and numeric trails)")
        if out.envelope is not None:
            from manifest.numeric.envelope import milestones

            add("", "noise envelope", "; ".join(out.envelope.runs))
            for bound in milestones(out.envelope, numeric or []):  # the verdict's bound
                add("", f"envelope step {bound.step}",
                    f"parameters {max(bound.groups, default=0.0):.2g}, loss {bound.loss:.2g} "
                    "(relative)")
    add("observed", "captured", manifest.observed.started_at)
    compute = manifest.observed.compute
    if compute is not None:
        add("compute", "wall time", f"{compute.wall_s:.3f} s")
        for rank in compute.ranks:
            add("", f"rank {rank.rank}", f"{rank.wall_s:.3f} s")
        add("", "GPU-hours", f"{compute.gpu_hours:.6g} ({compute.gpu_count} GPU(s))")
        if compute.energy_j is not None:
            add("", "energy", f"{compute.energy_j:.6g} J ({compute.energy_j / 3.6e6:.3g} kWh)")
        for gpu in compute.gpus:
            add("", f"GPU {gpu.index} energy", f"{gpu.energy_j:.6g} J")
        for key, reason in compute.unavailable.items():
            add("", f"{key} not recorded", reason)
    return rows


def render_show(manifest: Manifest, file: TextIO | None = None) -> None:
    """A readable summary of one manifest."""
    console = _console(file)
    console.print(f"[bold]run_id[/bold] {markup(manifest.run_id)}")
    console.print(f"[bold]digest[/bold] {markup(manifest.digest)}")
    # Aligned columns, never wrapped by us: a table folded 64-hex-digit hashes over two
    # lines at 80 columns, and a hash that is copied must be one line.
    rows = [("section", "fact", "value"), *show_rows(manifest)]
    wide = [max(len(row[i]) for row in rows) for i in (0, 1)]
    for i, (section, fact, value) in enumerate(rows):
        line = f"{section:<{wide[0]}}  {fact:<{wide[1]}}  {value}".rstrip()
        # Every recorded string is text, never markup or terminal control.
        console.print(f"[bold]{markup(line)}[/bold]" if i == 0 else markup(line))


def render_command(argv: list[str], file: TextIO | None = None) -> None:
    """Show the command verify is about to run (stderr)."""
    stream = file or sys.stderr
    stream.write(f"manifest: re-running: {shell_join(argv)}\n")
    stream.flush()


def render_dry_run(argv: list[str], file: TextIO | None = None) -> None:
    """``--dry-run``: what would be re-run; nothing is (stderr)."""
    stream = file or sys.stderr
    stream.write(f"manifest: --dry-run, not re-running: {shell_join(argv)}\n")
    stream.flush()


def render_plan(plan: RerunPlan, file: TextIO | None = None, *,
                drift: Sequence[Drift] = ()) -> None:
    """What a verb will run (or would, before a refusal), every string escaped (stderr),
    then the environment drift, folded as the report folds it."""
    stream = file or sys.stderr
    head = (f"will run ({plan.trust.reason})" if plan.trust.allowed else "would run")
    lines = [f"manifest: {plan.verb} {head}:"] + [
        f"manifest:   confinement: {plain_confinement(line.removeprefix('confinement: '))}"
        if line.startswith("confinement: ") else f"manifest:   {line}" for line in plan.lines()]
    if plan.trust.allowed and plan.trust.reason != plain_trust(plan.trust.reason):
        lines.append(f"manifest:   allowed because {plain_trust(plan.trust.reason)}")
    from manifest.cli.text import printable

    lines.extend(f"manifest:   drift ({impact}): {printable(reason)}"
                 for impact, reason in folded_drift(folded_environment(list(drift))))
    stream.write("\n".join(lines) + "\n")
    stream.flush()


def _fmt(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


VERDICT_STYLE: dict[Verdict, str] = {
    Verdict.IDENTICAL: "green", Verdict.CHECKED: "green", Verdict.EQUIVALENT: "cyan",
    Verdict.DIFFERS: "red", Verdict.CHANGED_TOPOLOGY: "red",
    Verdict.NOTHING_COMPARED: "yellow", Verdict.NO_VERDICT: "yellow"}
"""Each verify verdict's colour in the terminal; every :class:`Verdict` has one."""


def render_verify(report: VerifyReport, file: TextIO | None = None, *,
                  verbose: bool = False) -> None:
    """The human verify report: verdict first, then where and by how much (``verbose``:
    every package the run never imported on a line of its own, not one summary)."""
    from rich.table import Table

    console = _console(file)
    style = VERDICT_STYLE[Verdict(report.verdict)]
    console.print(f"[bold {style}]{markup(report.verdict)}[/bold {style}]  {markup(report.file)}  "
                  f"run_id {markup(report.run_id[:23])}…")
    if report.reason:
        console.print(f"reason: {markup(report.reason)}")
    if report.verdict != Verdict.CHECKED:  # --no-rerun compares no output: it has no basis
        basis = report.basis_text if report.rerun_exit_code is not None or report.basis != (
            "nothing") else "nothing: the command was not re-run (the reason says why)"
        console.print(f"compared: {markup(basis)}")
    if report.topology is not None and report.topology.get("text") != report.reason:
        console.print(f"topology: {markup(report.topology['text'])}")
    if report.job is not None:  # where it ran (--on): the job id and where to look
        job = report.job
        nodes = int(job.get("nodes") or 1)
        console.print(f"job: {markup(str(job['executor']))} {markup(str(job['job_id']))}"
                      + (f", {nodes} nodes" if nodes > 1 else "")
                      + f"; see {markup(str(job['where']))}")
    if report.environment is not None and report.rerun_exit_code is not None:
        console.print(f"environment: {markup(str(report.environment['line']))}")
    for sentence in report.outside_recipe:  # before any verdict detail: it qualifies them all
        console.print(f"[yellow]outside the recipe[/yellow]: {markup(sentence)}")
    for impact, reason in folded_drift(folded_environment(report.drift, verbose=verbose),
                                       verbose=verbose):
        tag = "[red]bits[/red]" if impact == "bits" else "benign"
        console.print(f"drift ({tag}): {markup(reason)}")
    if report.bits_drift and report.verdict != Verdict.IDENTICAL:
        console.print("the environment drifted in ways that can change bits: "
                      "bit-exactness is not expected.")
    for change in report.data:
        tag = "[red]data[/red]" if change.checked else "[yellow]data not checked[/yellow]"
        console.print(f"{tag}: {markup(change.detail)}")
        for name in change.files[:20]:
            console.print(f"  {markup(name)}")
        if len(change.files) > 20:
            console.print(f"  … and {len(change.files) - 20} more")
    for art in report.artifacts:
        if art.identical:
            console.print(f"[green]identical[/green] {markup(art.path)}")
            continue
        console.print(f"[red]differs[/red] {markup(art.path)}"
                      + (f" ({markup(art.detail)})" if art.detail else ""))
        if not art.tensors:
            continue
        table = Table(show_header=True, header_style="bold")
        for col in ("tensor", "change", "elements", "max |Δ|", "max ULP"):
            table.add_column(col)
        for t in art.tensors:
            count = "-" if t.elements is None else (
                f"{t.elements}/{t.total}" if t.total else str(t.elements))
            what = t.change if not t.detail else f"{t.change}: {t.detail}"
            table.add_row(markup(t.name), markup(what), count, _fmt(t.max_abs), _fmt(t.max_ulp))
        console.print(table)
    if report.numeric is not None:
        console.print(f"numeric trail vs the noise envelope: {markup(report.numeric['sentence'])}")
    if report.first_divergent_step is not None:
        console.print(f"first divergent step: {report.first_divergent_step}")
    op = report.first_divergent_op
    if op is not None:
        module = f"{op.module or '(top)'} ({op.module_type})" if op.module_type else (
            op.module or "(outside any module)")
        console.print(f"first divergent op: {op.op} in {module}, {op.where or '-'}, "
                      f"step {op.step}, {op.tensor}: {op.kind} (vs the recorded op stream)")
    elif report.trail_compared and report.first_divergent_step is None:
        console.print("step trails agree at every recorded step")


SAME_FACT = {"env.packages[numpy]": "env.numpy", "env.packages[torch]": "env.torch"}
"""A package line that repeats the dedicated line of the same library."""
NOT_RECORDED = ("env.unavailable[", "hardware.unavailable[")
"""Why a fact was not recorded: the fact itself has its own line."""


def folded_environment(drift: list[Drift], *, verbose: bool = False) -> list[Drift]:
    """The drift lines a reader needs, each fact once (``verbose``: every line as found).

    * the CUDA side of a torch build (its CUDA build, cuDNN, NCCL, ``nvidia-*``,
      ``triton``, ``cuda-*``) folds into torch's line, with "this run used no GPU"
      when verify found that (a cu130 build against a cpu one gave 20 such lines);
    * ``env.packages[numpy]`` goes where ``env.numpy`` says the same change;
    * the reasons a fact was not recorded fold into one counted line.

    The JSON report keeps every line.
    """
    if verbose:
        return list(drift)
    from dataclasses import replace

    from manifest.verify.drift import NO_GPU, cuda_family
    from manifest.verify.report import Drift

    paths = {d.path for d in drift}
    family = [d for d in drift if cuda_family(d.path)]
    no_gpu = "; this run used no GPU" if NO_GPU in paths and family else ""
    packages = [d.path.removeprefix("env.packages[").removesuffix("]") for d in family
                if d.path.startswith("env.packages[")]
    facts = [d.reason.split(":", 1)[0] for d in family if not d.path.startswith("env.packages[")]
    if packages:
        shown = ", ".join(packages[:3]) + (f" and {len(packages) - 3} more"
                                            if len(packages) > 3 else "")
        facts.append(f"{len(packages)} package(s): {shown}")
    with_it = f"the CUDA libraries with it differ too ({'; '.join(facts)}){no_gpu}"
    out: list[Drift] = []
    hidden = 0
    torch_line = "env.torch" in paths
    for d in drift:
        if d.path.startswith(NOT_RECORDED):
            hidden += 1
        elif (d.path == NO_GPU and family) or (d.path in SAME_FACT
                                               and SAME_FACT[d.path] in paths):
            continue
        elif d.path == "env.torch" and family:
            out.append(replace(d, reason=f"{d.reason}; {with_it}"))
        elif d in family:
            if not torch_line and d is family[0]:
                impact = "bits" if any(f.impact == "bits" for f in family) else "benign"
                out.append(Drift("env.packages", impact, f"torch's build: {with_it}"))
        else:
            out.append(d)
    if hidden:
        out.append(Drift("env.unavailable", "benign", f"{hidden} fact(s) not recorded on one "
                         "side, each with its reason (--verbose lists them)"))
    return out


NO_DRIVER = "no NVIDIA driver"
"""The GPU reason on a machine without an NVIDIA driver: the normal case on a CPU box."""


def capture_notes(manifest: Manifest, *, verbose: bool = False) -> list[str]:
    """One sentence per fact a capture could not record or the user should know.

    The CLI prints these to stderr (``manifest: note: …``); the manifest
    itself carries the same reasons in each section's ``unavailable`` map.
    A fact that is missing because the machine simply has none of it (no
    NVIDIA driver on a CPU machine) is the normal case there: noted only
    with ``verbose``.
    """
    notes: list[str] = []
    code = manifest.code
    if "commit" in code.unavailable:
        reason = code.unavailable["commit"]
        if code.dirty is None:
            notes.append(f"{reason}; the code section is recorded as null.")
        else:
            notes.append(f"{reason}; the working tree is recorded as a patch against nothing.")
    if code.detached and code.commit:
        notes.append(f"HEAD is detached at {code.commit[:12]}; the commit is recorded, "
                     "no branch.")
    if code.shallow:
        notes.append("the repository is a shallow clone; verify needs the commit in local "
                     "history ('git fetch --unshallow' if it is missing).")
    if code.dirty and code.diff_digest:
        store = manifest.observed.store or ".manifest"
        blob = code.diff_digest.replace(":", "-", 1)
        untracked = f", {code.untracked_files} untracked file(s) included" if (
            code.untracked_files) else ""
        notes.append(f"the working tree has uncommitted changes{untracked}; their patch is "
                     f"stored as {store}/blobs/{blob}.")
    if "untracked_secrets" in code.unavailable:
        notes.append(f"{code.unavailable['untracked_secrets']}; verify's re-run will not have "
                     "them.")
    if manifest.command:
        from manifest.redact import SECRET_ENV_PREFIX, withheld

        numbers = [n for n in withheld(manifest.command.argv) if n]
        if numbers:
            names = ", ".join(f"{SECRET_ENV_PREFIX}{n}" for n in numbers)
            notes.append(f"{len(numbers)} value(s) in the command look like credentials and "
                         f"are recorded as <redacted:N>; to re-run, verify reads them from "
                         f"{names}.")
    notes.extend(run_notes(manifest))
    missing: list[str] = []
    if manifest.env.torch is None:
        missing.append(f"torch ({manifest.env.unavailable.get('torch', 'not found')})")
    gpu_reason = manifest.hardware.unavailable.get("gpus", "not found")
    if manifest.hardware.gpus is None and (verbose or NO_DRIVER not in gpu_reason):
        missing.append(f"GPUs ({manifest.hardware.unavailable.get('gpus', 'not found')})")
    if missing:
        notes.append(f"recorded as null: {'; '.join(missing)}.")
    return notes


def capture_failure(outputs: Outputs) -> str:
    """The one sentence ``capture`` prints on stderr when it exits 3 (no complete run)."""
    first = (outputs.error or "").strip().splitlines()
    reason = first[-1].rstrip(".") if first else "no reason recorded"
    if outputs.exit_code not in (None, 0):
        return (f"the command failed with exit status {outputs.exit_code} ({reason}); "
                "the manifest records the failure.")
    return f"the run is incomplete: {reason}; the manifest records it."
_LOOSENING = {
    "allow_tf32": ("True",), "fp32_precision": ("tf32",), "benchmark": ("True",),
    "deterministic": ("False",), "torch.use_deterministic_algorithms": ("False",),
    "torch.set_float32_matmul_precision": ("high", "medium"),
}


def _loosens(switch: str, value: str) -> bool:
    for name, values in _LOOSENING.items():
        if (switch == name or switch.endswith("." + name)) and value in values:
            return True
    return False


def run_notes(manifest: Manifest) -> list[str]:
    """What the run did to the recipe and its seeds, and what capture left out or found."""
    notes: list[str] = []
    for proc in manifest.determinism.processes:
        for sw in proc.switches or []:
            if sw.switch == "torch.autocast":
                notes.append(f"{sw.site} entered torch.autocast ({sw.value}): mixed precision "
                             "is in use.")
            elif _loosens(sw.switch, sw.value):
                tf32 = "tf32" in sw.switch or sw.value == "tf32"
                why = ("matmuls may lose bit-exactness across GPUs" if tf32 or "precision" in
                       sw.switch else "kernels may no longer be deterministic")
                notes.append(f"{sw.site} set {sw.switch} = {sw.value} after the launcher "
                             f"applied the recipe: {why}.")
    from manifest.diff.overrides import reseed_notes

    notes += [f"{note}." for note in reseed_notes(manifest)]
    blind = [str(r.rank) for r in manifest.randomness.processes
             if r.at_start is not None and r.at_start.python is None]
    if blind:
        # Python's own generator always has a state: only a process that could not hash
        # it (no blake3 in that interpreter) records none.
        notes.append(f"rank(s) {', '.join(blind[:8])} could not import blake3, so no step "
                     "trail and no random state were fingerprinted: verify can compare only the "
                     "declared outputs. The command's Python is probably not the one manifest "
                     "is installed in; install torch-manifest into it.")
    found = [ds.path for ds in manifest.data if ds.source == "discovered"]
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        notes.append(f"the run read {shown}, which git does not carry: digested as discovered "
                     "data (declare with --data to name it).")
    obs = manifest.observed
    if obs.large_untracked:
        names = sorted(obs.large_untracked)
        tops = sorted({n.split("/")[0] + ("/" if "/" in n else "") for n in names})
        notes.append(f"{len(names)} untracked file(s) over 1 MiB left out of the code patch "
                     f"({', '.join(names[:3])}{' …' if len(names) > 3 else ''}); if they are "
                     f"not code, add to .gitignore: {' '.join(tops[:5])}")
    for lock in obs.lockfile_disagrees or []:
        notes.append(f"{lock.lockfile} pins {lock.package} {lock.locked}, but the run used "
                     f"{lock.installed}: the lockfile does not describe this run's environment.")
    if obs.inputs_not_digested:
        names = sorted(obs.inputs_not_digested)
        total = sum(obs.inputs_not_digested.values())
        notes.append(f"the run read {len(names)} more file(s) git does not carry ({total} bytes, "
                     f"e.g. {names[0]}): too many or too large to digest unasked; declare their "
                     "folder with --data so verify can provide and check them.")
    return notes
