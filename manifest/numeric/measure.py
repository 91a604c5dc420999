"""Measuring a run's noise envelope: the rounding-only runs, made by the caller's runner.

``capture --envelope N``, ``lab --envelope N`` and ``verify --envelope N`` all call
``measure``: after the run itself (the base), N runs whose state is moved one ULP
before the first update (``LaunchSettings.perturb``) and one run under another thread
count (2 → 1, or 1 → 2), each compared with the base step by step
(``envelope.measure_envelope``).

* **Fresh seeds.** Each one-ULP run's seed is drawn from the operating system's
  generator (``fresh_seeds``), never 1…N: whoever wrote the script cannot know which
  perturbations its envelope will see.
* **No marker.** A run learns its perturbation from the launcher's private file, which
  every run gets, the real run included (``manifest.launch.runner.PRIVATE_FILE``):
  argv and the environment of an envelope run are the real run's, and the thread-count
  run differs only in its thread variables. Every run starts from the tree the real run
  started from (``start``, ``files_kept.reset``): with the real run's outputs in place, a
  script that adds noise only when its output is already there makes every envelope run
  noisy, widens the envelope and gets ``equivalent`` for planted weights. verify runs its
  re-run among the envelope runs at a drawn place (``real``), so neither the tree nor the
  order tells which run is judged. (Code written to find its
  own perturbation, by reading the launcher's private directory or by re-drawing its own
  initial weights and comparing, can still tell; ``identical`` on the same hardware type
  is the adversarial-grade verdict.)
* **Nothing left in the user's tree.** verify measures in its scratch clone. capture and
  lab measure where the run ran (the same path, so the path is no marker either), so
  ``files_kept`` copies aside every file the base run wrote, every declared output and
  every recorded checkpoint, puts them back byte for byte after the last run (on
  SIGTERM and SIGHUP too), and deletes what only the envelope runs wrote (otherwise,
  after ``capture --envelope 3`` the checkpoints on disk are the last envelope run's,
  and ``verify --segments`` says "checkpoint … changed since capture").

A run that fails is left out of the envelope and named. Cost: N + 1 more runs of the
command; on the bundled example (60 steps, 2 threads, CPU) each is about 2 s.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.models import Envelope, NumericPoint
from manifest.numeric.envelope import ULP_LABEL, measure_envelope
from manifest.numeric.twin import TWIN_LABEL

if TYPE_CHECKING:
    from manifest.launch.runner import LaunchResult, LaunchSettings

SEED_RANGE = 2**31 - 1
"""One-ULP seeds are drawn from 1 … 2**31 - 1 (``torch.Generator.manual_seed`` takes them)."""


def numeric_of(records: Sequence[ProcessRecord]) -> list[NumericPoint]:
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


def fresh_seeds(count: int) -> list[int]:
    """``count`` distinct one-ULP seeds from the operating system's generator."""
    seeds: list[int] = []
    while len(seeds) < count:
        seed = secrets.randbelow(SEED_RANGE) + 1
        if seed not in seeds:
            seeds.append(seed)
    return seeds


@dataclass
class Measured:
    envelope: Envelope | None
    failed: list[str] = field(default_factory=list)
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    """What the clean-up after the runs could not undo (``files_kept``)."""
    twin: list[NumericPoint] | None = None
    """The twin's trail, when one was asked for and ran (``measure``'s ``twin``)."""
    real: LaunchResult | None = None
    """The real run's result, when ``measure`` ran it (``real``)."""


TwinHook = Callable[["LaunchResult", Callable[[Path], "Path | None"]], object]
"""Called right after the twin run, its files still in place, with the run's result and a
function giving the kept copy of one of the run's own files (None: not kept)."""


def measure(base: Sequence[NumericPoint], settings: LaunchSettings, runs: int,
            run: Callable[[LaunchSettings], LaunchResult], *, cwd: Path,
            outputs: Sequence[str], say: Callable[[str], None] | None = None,
            seeds: Sequence[int] | None = None, keep: Iterable[Path] = (),
            tree: Path | None = None, twin: TwinHook | None = None,
            start: set[str] | None = None, owned: bool = False,
            real: Callable[[], LaunchResult] | None = None) -> Measured:
    """The envelope of the run whose numeric trail is ``base`` (made under ``settings``).

    ``keep``: files besides the declared outputs to put back after the runs (what the
    base run wrote, its checkpoints); ``tree``: where files the envelope runs alone
    created are deleted (None: nothing is kept or deleted, the caller's tree is scratch).
    ``start``: the listing of ``tree`` (``listing``) before the real run: every run then
    starts from that tree, the real run's files moved aside (``files_kept.reset``;
    ``owned``: the tree is verify's scratch clone, where anything new is a run's).
    ``real`` (verify): the real run itself, run at a place among the envelope runs drawn
    from the operating system's generator, its trail the base (``base`` is not used), its
    result in ``Measured.real``; its files are what the tree holds afterwards.
    ``twin`` (``capture --precision``, ``numeric.twin``): first one unperturbed run under
    ``settings`` (which emulate the precision), whose trail, not ``base``, the other runs
    are measured against; ``twin`` is called while its files are in place. Its trail is
    read like ``base``'s (``numeric_of``: the lowest rank with a trail). A twin that
    fails is named in ``failed`` and the runs are measured against ``base`` as before.
    """
    if not base and real is None:
        return Measured(None, reason=_NO_TRAIL)
    drawn = list(seeds) if seeds is not None else fresh_seeds(runs)
    plans: list[tuple[str, LaunchSettings | None]] = [
        (f"{ULP_LABEL} (seed {s})", replace(settings, perturb=s)) for s in drawn]
    threads = other_threads(settings.threads)
    plans.append((f"threads {settings.threads} → {threads}", replace(settings, threads=threads)))
    if real is not None:  # no run can tell from its place which one is judged
        plans.insert(secrets.SystemRandom().randrange(len(plans) + 1), (_REAL, None))
    measured: list[tuple[str, list[NumericPoint]]] = []
    failed: list[str] = []
    kept = files_kept(cwd, outputs, keep, tree, start, owned)
    twin_trail: list[NumericPoint] | None = None
    real_result: LaunchResult | None = None
    with kept:
        if twin is not None:
            if say is not None:
                say(f"envelope run: {TWIN_LABEL}")
            kept.reset()
            result = run(settings)
            kept.written(result.opened)
            twin_trail = numeric_of(result.records) or None
            if result.exit_code != 0 or twin_trail is None:
                twin_trail = None
                failed.append(f"{TWIN_LABEL}: exit {result.exit_code}" if result.exit_code
                              else f"{TWIN_LABEL}: no numeric trail")
            else:
                twin(result, kept.aside)
        for label, planned in plans:
            kept.reset()
            if planned is None:
                assert real is not None
                real_result = real()
                kept.adopt(real_result.opened)  # the judged run's files: what stays
                continue
            if say is not None:
                say(f"envelope run: {label}")
            result = run(planned)
            kept.written(result.opened)
            trail = numeric_of(result.records)
            if result.exit_code != 0 or not trail:
                failed.append(f"{label}: exit {result.exit_code}" if result.exit_code
                              else f"{label}: no numeric trail")
                continue
            measured.append((label, trail))
    if real_result is not None:
        base = numeric_of(real_result.records)
        if not base:
            return Measured(None, failed, _NO_TRAIL, kept.notes, real=real_result)
    if not measured:
        return Measured(None, failed, "every envelope run failed", kept.notes,
                        real=real_result)
    return Measured(measure_envelope(twin_trail or base, measured), failed, notes=kept.notes,
                    twin=twin_trail, real=real_result)


_REAL = "the run judged"
_NO_TRAIL = ("the run recorded no numeric trail (no optimizer step or backward() under the "
             "launcher, or the trail is off)")


def written_files(opened: dict[str, str]) -> list[Path]:
    """The files a run opened for writing (``LaunchResult.opened``)."""
    return [Path(path) for path, mode in opened.items() if "w" in mode]


def listing(tree: Path) -> set[str]:
    """Every file, link and directory under ``tree`` (real paths), ``.git`` left out: what
    ``measure``'s ``start`` takes, before the real run."""
    return _listing(tree)


class files_kept:
    """Copies the files matching ``outputs`` (and ``keep``) aside and puts them back on
    exit; with a ``tree``, deletes the files the runs wrote there that did not exist
    before (``written``), and names those it could not put back.

    With ``start`` (the tree's listing before the real run), every file the real run
    created there is kept too, and ``reset`` (before each run) brings the tree back to
    that listing: what the real run created, and what an envelope run wrote, is moved
    out (the kept copies come back on exit). In the user's tree only files a run opened
    for writing (``written``) are deleted; with ``owned`` (verify's scratch clone) every
    file the listing did not hold. A file that existed at the start and that the
    real run rewrote cannot be brought back to its earlier bytes (none were kept): each
    run finds the real run's version of it. SIGTERM and SIGHUP raise
    ``manifest.errors.Terminated`` while the runs go on (main thread), so the
    files are put back on those too; SIGINT already raises."""

    def __init__(self, cwd: Path, outputs: Sequence[str], keep: Iterable[Path] = (),
                 tree: Path | None = None, start: set[str] | None = None,
                 owned: bool = False) -> None:
        self.cwd = cwd
        self.owned = owned
        self.outputs = outputs
        self.keep = list(keep)
        self.tree = tree
        self.start = start
        self.kept: list[tuple[Path, Path]] = []
        self.before: set[str] = set()
        self.wrote: set[str] = set()
        self.notes: list[str] = []
        self.tmp: tempfile.TemporaryDirectory[str] | None = None
        self.handlers: dict[signal.Signals, Any] = {}

    def __enter__(self) -> files_kept:
        from manifest.errors import raise_terminated as _raise

        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGHUP):
                self.handlers[signum] = signal.signal(signum, _raise)
        self.tmp = tempfile.TemporaryDirectory(prefix="manifest-envelope-")
        sources = [self.cwd / rel for pattern in self.outputs
                   for rel in sorted(glob.glob(pattern, root_dir=self.cwd, recursive=True))]
        if self.tree is not None and self.start is not None:
            sources += [Path(p) for p in sorted(_listing(self.tree) - self.start)]
        self._keep_copies([*sources, *self.keep])
        if self.tree is not None:
            self.before = _listing(self.tree)
        return self

    def _keep_copies(self, sources: Iterable[Path], *, replace_kept: bool = False) -> None:
        assert self.tmp is not None
        seen = {str(source) for source, _ in self.kept}
        root = os.path.realpath(self.tree) if self.tree is not None else None
        for source in sources:
            key = os.path.realpath(source)
            if not source.is_file() or source.is_symlink():
                continue
            if root is not None and os.path.commonpath([root, key]) != root:
                continue  # outside the tree (a cache, /tmp): not the user's files to keep
            if key in seen:
                if not replace_kept:
                    continue
                self.kept = [(s, a) for s, a in self.kept if str(s) != key]
            seen.add(key)
            aside = Path(self.tmp.name) / str(len(os.listdir(self.tmp.name)))
            shutil.copy2(source, aside)
            self.kept.append((Path(key), aside))

    def aside(self, path: Path) -> Path | None:
        """The copy kept of ``path`` (None: it was not kept)."""
        key = os.path.realpath(path)
        return next((copy for source, copy in self.kept if str(source) == key), None)

    def written(self, opened: dict[str, str]) -> None:
        self.wrote.update(os.path.realpath(p) for p in written_files(opened))

    def adopt(self, opened: dict[str, str]) -> None:
        """The real run ran just now (``measure``'s ``real``): its files are the ones to put
        back at the end, as if it had run last."""
        if self.tree is None:
            return
        fresh = [Path(p) for p in sorted(_listing(self.tree) - (self.start or set()))]
        self._keep_copies([*fresh, *written_files(opened)], replace_kept=True)
        self.before = _listing(self.tree)

    def reset(self) -> None:
        """The tree as the real run found it (``start``; without it, as the real run left
        it less its kept files): what the real run and the envelope runs created is moved
        out, deepest first; a directory that is not empty stays."""
        if self.tree is None:
            return
        base = self.start if self.start is not None else self.before
        restored = {str(source) for source, _ in self.kept}
        now = _listing(self.tree)
        targets = now - base
        if self.start is None:
            targets |= restored & now
        for path in sorted(targets, reverse=True):
            directory = os.path.isdir(path) and not os.path.islink(path)
            if not directory and path not in restored and not (
                    self.owned or path in self.wrote):
                continue  # not known to be a run's (the user's tree): left in place
            try:
                os.rmdir(path) if directory else os.unlink(path)
            except OSError:
                continue

    def __exit__(self, *exc: object) -> None:
        try:
            self.reset()
            for source, aside in self.kept:
                source.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(aside, source)
            self._clean()
        finally:
            if self.tmp is not None:
                self.tmp.cleanup()
            for signum, handler in self.handlers.items():
                signal.signal(signum, handler)
    def _clean(self) -> None:
        if self.tree is None:
            return
        restored = {str(source) for source, _ in self.kept}
        root = os.path.realpath(self.tree)
        lost: list[str] = []
        for path in sorted(self.wrote - restored):
            if os.path.commonpath([root, path]) != root:
                continue  # outside the tree: the base run wrote there too, nothing to undo
            if path in self.before:
                lost.append(os.path.relpath(path, root))
            elif os.path.isfile(path):
                os.unlink(path)
                _prune(Path(path).parent, Path(root), self.before)
        if lost:
            self.notes.append(f"the envelope runs rewrote {len(lost)} file(s) the run itself "
                              f"did not write, which could not be put back: "
                              f"{', '.join(lost[:5])}")


def _listing(tree: Path) -> set[str]:
    """Every file and directory under ``tree`` (real paths), skipping ``.git``."""
    root = os.path.realpath(tree)
    found = {root}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        found.update(os.path.join(dirpath, n) for n in [*dirnames, *filenames])
    return found


def _prune(directory: Path, root: Path, before: set[str]) -> None:
    """Remove the directories the envelope runs created and left empty, up to ``root``."""
    while str(directory) not in before and directory != root and directory.is_dir():
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent
