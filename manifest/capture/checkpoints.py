"""The checkpoints a run saved, as the manifest records them (``outputs.checkpoints``).

The launcher notes each save with its step and the file's stat signature
(``launch/boot/_manifest_checkpoints``); this module turns the notes of every
process into entries, after the run:

* one entry per (path, step): ranks that saved the same DCP directory at the
  same step are one checkpoint;
* a safetensors shard named by a ``*.safetensors.index.json`` beside it
  stands for the index: the sharded checkpoint is one entry, read whole;
* only the last save of a path can still be on disk: earlier ones are named
  ``saved again at step N`` and the last one is digested only if its stat
  signature is the one the launcher saw (a file rewritten by something other
  than a recorded save is named, not trusted);
* a checkpoint outside the repository is named: no re-run could find it;
* a checkpoint in a Hugging Face ``checkpoint-N/`` directory carries the other regular
  files there (``trainer_state.json``, ``optimizer.pt``, ``rng_state.pth`` …: what
  ``Trainer`` reads when it resumes) by name, size and blake3 (``siblings``): ``verify
  --at`` copies exactly those, bounded by those sizes and checked against those digests,
  and refuses a file placed there since (a planted ``trainer_state.json`` would steer the
  resume unseen). Each directory is read once, whatever the number of checkpoints in it
  (the Trainer's ``torch.save`` of its optimizer and RNG states are checkpoints too), at
  most :data:`MAX_SIBLINGS` files; links and anything not a regular file are left out, as
  verify leaves them out.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.launch.process import read_processes
from manifest.models import Checkpoint, SiblingFile

MAX_SIBLINGS = 256
"""Files recorded beside one checkpoint (a Trainer's checkpoint directory holds about 8; a
run that saves one file per rank there, one per rank): past it, the rest are not recorded,
so verify refuses them by name."""



HF_CHECKPOINT = re.compile(r"checkpoint-[0-9]+")
"""A Hugging Face Trainer's checkpoint directory: the files beside its weights (trainer
state, optimizer, scheduler, RNG) are what a resume reads, so they are recorded with it."""

def siblings_of(path: Path, cache: dict[str, dict[str, SiblingFile]]) -> dict[str, SiblingFile]:
    """The regular files beside ``path`` in its directory (``path`` itself left out), each
    read once through the bounded reader (no link followed, checked after the open)."""
    from manifest.bounded import InputKind, copy_regular_at
    from manifest.errors import ManifestError

    directory = str(path.parent)
    if directory not in cache:
        found: dict[str, SiblingFile] = {}
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            cache[directory] = found
            return found
        try:
            with os.scandir(fd) as entries:
                names = sorted(e.name for e in entries if e.is_file(follow_symlinks=False))
            for name in names[:MAX_SIBLINGS + 1]:
                try:
                    size, digest = copy_regular_at(fd, name, None, InputKind.WEIGHTS)
                except (ManifestError, OSError):
                    continue  # replaced by a link or a FIFO meanwhile: not recorded
                found[name] = SiblingFile(bytes=size, digest=digest)
        finally:
            os.close(fd)
        cache[directory] = found
    kept = {name: f for name, f in cache[directory].items() if name != path.name}
    return dict(list(kept.items())[:MAX_SIBLINGS])


def _signature(path: Path, kind: str) -> list[int] | None:
    try:
        st = os.stat(path / ".metadata" if kind == "dcp" else path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _index_for(shard: Path) -> Path | None:
    from manifest.errors import MalformedArtifactError
    from manifest.weights.bounds import WeightFileError
    from manifest.weights.sharded import INDEX_SUFFIX, weight_map

    try:
        candidates = sorted(shard.parent.glob("*" + INDEX_SUFFIX))
    except OSError:
        return None
    for index in candidates:
        try:
            if shard.name in set(weight_map(index).values()):
                return index
        except (OSError, WeightFileError, MalformedArtifactError):  # not a readable index
            continue
    return None


def _notes(records: list[ProcessRecord]) -> list[tuple[int, str, str, list[int] | None]]:
    """(step, absolute path, kind, signature) of every recorded save, in save order."""
    return [(c.step, c.path, c.kind, c.sig)
            for p in read_processes(records) for c in p.checkpoints]


def record_checkpoints(records: list[ProcessRecord], cwd: Path,
                       root: Path) -> list[Checkpoint]:
    """``outputs.checkpoints`` from the processes' records (sorted by step, then path)."""
    from manifest.errors import MalformedArtifactError
    from manifest.weights.tables import digest_artifact

    saves: dict[tuple[str, int], tuple[str, list[int] | None]] = {}
    for step, raw, kind, sig in _notes(records):
        path = Path(raw)
        if kind == "safetensors":
            index = _index_for(path)
            if index is not None:
                path, kind, sig = index, "safetensors-index", None
        saves.setdefault((str(path), step), (kind, sig))
    last: dict[str, int] = {}
    for path_text, step in saves:
        last[path_text] = max(step, last.get(path_text, step))
    out = []
    beside: dict[str, dict[str, SiblingFile]] = {}
    root = root.resolve()
    order = sorted(saves.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    for (path_text, step), (kind, sig) in order:
        path = Path(path_text)
        try:
            display = os.path.relpath(path, cwd)
            inside = path.resolve().is_relative_to(root)
        except ValueError:
            display, inside = path_text, False
        if not inside:
            out.append(Checkpoint(step=step, path=path_text, artifact=None,
                                  lost="outside the repository: a re-run cannot reach it"))
            continue
        if last[path_text] != step:
            out.append(Checkpoint(step=step, path=display, artifact=None,
                                  lost=f"saved again at step {last[path_text]} (one file per "
                                  "checkpoint keeps each)"))
            continue
        if not path.exists():
            out.append(Checkpoint(step=step, path=display, artifact=None,
                                  lost="gone by the end of the run"))
            continue
        if sig is not None and _signature(path, kind) != sig:
            out.append(Checkpoint(step=step, path=display, artifact=None,
                                  lost="changed after the save at this step"))
            continue
        try:
            artifact = digest_artifact(path, display)
        except (MalformedArtifactError, OSError) as exc:
            out.append(Checkpoint(step=step, path=display, artifact=None,
                                  lost=f"unreadable: {exc}"[:300]))
            continue
        siblings = (siblings_of(path, beside) if HF_CHECKPOINT.fullmatch(path.parent.name)
                    and path.is_file() else None)
        out.append(Checkpoint(step=step, path=display, artifact=artifact, lost=None,
                              siblings=siblings))
    return out
