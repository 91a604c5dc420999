"""Human renderings (rich) of manifests and reports. Only the CLI calls these."""

from __future__ import annotations

import sys
from typing import TextIO

from manifest.models import Manifest


def _console(file: TextIO | None = None):  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console(file=file or sys.stdout, highlight=False, soft_wrap=True)


def render_show(manifest: Manifest, file: TextIO | None = None) -> None:
    """A readable summary of one manifest."""
    from rich.table import Table

    console = _console(file)
    console.print(f"[bold]run_id[/bold] {manifest.run_id}")
    console.print(f"[bold]digest[/bold] {manifest.digest}")
    table = Table(show_header=True, header_style="bold")
    table.add_column("section")
    table.add_column("fact")
    table.add_column("value", overflow="fold")
    code = manifest.code
    table.add_row("code", "commit", code.commit or f"- ({code.unavailable.get('commit', '')})")
    table.add_row("", "dirty", str(code.dirty))
    if code.diff_digest:
        table.add_row("", "diff", code.diff_digest)
    for name, digest in code.lockfiles.items():
        table.add_row("", f"lockfile {name}", digest)
    for ds in manifest.data:
        table.add_row("data", ds.name, f"{ds.root} ({ds.files} files, {ds.bytes} bytes)")
    env = manifest.env
    table.add_row("env", "python", f"{env.implementation} {env.python}")
    table.add_row("", "torch", env.torch or "-")
    table.add_row("", "torch CUDA build", env.torch_cuda or "-")
    table.add_row("", "cuDNN / NCCL", f"{env.cudnn or '-'} / {env.nccl or '-'}")
    table.add_row("", "packages", f"{len(env.packages)} ({env.packages_digest})")
    for key, value in env.variables.items():
        table.add_row("", key, value)
    hw = manifest.hardware
    gpus = ", ".join(g.name for g in hw.gpus) if hw.gpus else f"- ({hw.unavailable.get('gpus')})"
    table.add_row("hardware", "GPUs", gpus)
    table.add_row("", "CPU", hw.cpu_model or "-")
    table.add_row("", "ISA", " ".join(hw.cpu_isa) or "-")
    rnd, det = manifest.randomness, manifest.determinism
    table.add_row("randomness", "seed", "-" if rnd.seed is None else str(rnd.seed))
    table.add_row("determinism", "enforced", str(det.requested))
    table.add_row("", "threads", "-" if det.num_threads is None else str(det.num_threads))
    if manifest.command:
        table.add_row("command", "argv", " ".join(manifest.command.argv))
    if manifest.outputs:
        out = manifest.outputs
        table.add_row("outputs", "status", f"{out.status} (exit {out.exit_code})")
        for art in out.artifacts:
            n = len(art.tensors) if art.tensors is not None else 0
            table.add_row("", art.path, f"{art.format}, {n} tensors, {art.digest}")
    table.add_row("observed", "captured", manifest.observed.started_at)
    console.print(table)
