"""Measuring a run's noise envelope: the rounding-only runs, made by the caller's runner.

``capture --envelope N`` and ``lab --envelope N`` both call ``measure``: after the run
itself (the base), N runs whose state is moved one ULP before the first update (seeds
1…N, ``LaunchSettings.perturb``) and one run under another thread count (2 → 1, or
1 → 2), each compared with the base step by step (``envelope.measure_envelope``).

The runs write where the base run wrote, so the declared outputs of the base run are
copied aside first and put back, byte for byte, after the last one: the files a
manifest describes are the base run's. A run that fails is left out of the envelope
and named.

Cost: N + 1 more runs of the command. On the bundled example (60 steps, 2 threads,
CPU) each is about 2 s.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.models import Envelope, NumericPoint
from manifest.numeric.envelope import ULP_LABEL, measure_envelope

if TYPE_CHECKING:
    from manifest.capture.launcher import LaunchResult, LaunchSettings


def numeric_of(records: Sequence[dict[str, Any]]) -> list[NumericPoint]:
    """Rank 0's numeric trail from process records (the first process with one)."""
    ordered = sorted(records, key=lambda r: (r.get("rank") or 0))
    for record in ordered:
        raw = record.get("numeric")
        if isinstance(raw, list) and raw:
            out = []
            for item in raw:
                try:
                    out.append(NumericPoint.model_validate(item))
                except ValueError:
                    continue
            return out
    return []


def other_threads(threads: int) -> int:
    return 1 if threads > 1 else 2


@dataclass
class Measured:
    envelope: Envelope | None
    failed: list[str] = field(default_factory=list)
    reason: str | None = None


def measure(base: Sequence[NumericPoint], settings: LaunchSettings, runs: int,
            run: Callable[[LaunchSettings], LaunchResult], *, cwd: Path,
            outputs: Sequence[str], say: Callable[[str], None] | None = None) -> Measured:
    """The envelope of the run whose numeric trail is ``base`` (made under ``settings``)."""
    if not base:
        return Measured(None, reason="the run recorded no numeric trail (no optimizer step "
                        "or backward() under the launcher, or the trail is off)")
    plans: list[tuple[str, LaunchSettings]] = [
        (f"{ULP_LABEL} (seed {s})", replace(settings, perturb=s)) for s in range(1, runs + 1)]
    threads = other_threads(settings.threads)
    plans.append((f"threads {settings.threads} → {threads}", replace(settings, threads=threads)))
    measured: list[tuple[str, list[NumericPoint]]] = []
    failed: list[str] = []
    with _outputs_kept(cwd, outputs):
        for label, planned in plans:
            if say is not None:
                say(f"envelope run: {label}")
            result = run(planned)
            trail = numeric_of(result.records)
            if result.exit_code != 0 or not trail:
                failed.append(f"{label}: exit {result.exit_code}" if result.exit_code
                              else f"{label}: no numeric trail")
                continue
            measured.append((label, trail))
    if not measured:
        return Measured(None, failed, "every envelope run failed")
    return Measured(measure_envelope(base, measured), failed)


class _outputs_kept:
    """Copies the files matching ``outputs`` aside and puts them back on exit."""

    def __init__(self, cwd: Path, outputs: Sequence[str]) -> None:
        self.cwd = cwd
        self.outputs = outputs
        self.kept: list[tuple[Path, Path]] = []
        self.tmp: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> _outputs_kept:
        import glob

        self.tmp = tempfile.TemporaryDirectory(prefix="manifest-envelope-")
        for i, pattern in enumerate(self.outputs):
            for rel in sorted(glob.glob(pattern, root_dir=self.cwd, recursive=True)):
                source = self.cwd / rel
                if source.is_file():
                    aside = Path(self.tmp.name) / f"{i}-{len(self.kept)}"
                    shutil.copy2(source, aside)
                    self.kept.append((source, aside))
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for source, aside in self.kept:
                source.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(aside, source)
        finally:
            if self.tmp is not None:
                self.tmp.cleanup()
