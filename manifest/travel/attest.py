"""``manifest attest``: an in-toto Statement v1 about a training run, signed.

No vetted in-toto predicate for a training run exists yet, so this tool names
its own, :data:`TRAINING_RUN_PREDICATE`, whose predicate is the manifest itself
(every section, as its canonical JSON, with ``run_id`` and ``digest``). The
subjects are the run's output artifacts, each ``{"name": <path as recorded>,
"digest": {"sha256": …}}``: Sigstore's verifier accepts no other digest name in
a subject, so the files are re-read here, their blake3 checked against the
manifest (a file that changed since capture is refused), and their sha256
computed. BLAKE3 stays inside the predicate (``outputs.artifacts[].digest``).

The output (``run.intoto.jsonl``) has one line: a Sigstore bundle holding the
DSSE envelope, signed by the methods of :mod:`manifest.travel.sign`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import blake3

from manifest.errors import DataError, UsageError
from manifest.models import Artifact, Manifest

TRAINING_RUN_PREDICATE = "https://manifest.dev/predicates/training-run/v1"
_CHUNK = 1 << 22


def _digests(path: Path) -> tuple[str, str]:
    """(blake3 name, sha256 hex) of a file, read once."""
    b3 = blake3.blake3(max_threads=blake3.blake3.AUTO)
    sha = hashlib.sha256()
    from manifest.bounded import InputKind, open_user_file

    # A recorded output may be a committed symlink to a device or a FIFO: refused,
    # not hashed forever.
    with open_user_file(path, InputKind.ARTIFACT) as fh:
        while chunk := fh.read(_CHUNK):
            b3.update(chunk)
            sha.update(chunk)
    return "blake3:" + b3.hexdigest(), sha.hexdigest()


def artifact_path(manifest: Manifest, artifact: Artifact, root: Path) -> Path:
    cwd = manifest.command.cwd if manifest.command is not None else "."
    return root / cwd / artifact.path


def output_subjects(manifest: Manifest, root: Path) -> list[dict[str, Any]]:
    """One subject per recorded artifact, its bytes checked against the recorded blake3."""
    if manifest.outputs is None or not manifest.outputs.artifacts:
        raise UsageError("the manifest records no output artifacts to attest.")
    subjects = []
    for artifact in manifest.outputs.artifacts:
        path = artifact_path(manifest, artifact, root)
        try:
            b3, sha = _digests(path)
        except OSError as exc:
            raise DataError(f"cannot read the output {artifact.path} at {path}: "
                            f"{exc.strerror or exc}.") from exc
        if b3 != artifact.digest:
            raise DataError(f"the output {artifact.path} changed since the run "
                            f"(blake3 {b3[:19]}…, recorded {artifact.digest[:19]}…).")
        subjects.append({"name": artifact.path, "digest": {"sha256": sha}})
    return subjects


def run_statement(manifest: Manifest, root: Path) -> bytes:
    """The statement's canonical bytes: output subjects, the manifest as predicate."""
    from manifest.canonical import to_document
    from manifest.travel.sign import statement_bytes

    return statement_bytes(output_subjects(manifest, root), TRAINING_RUN_PREDICATE,
                           to_document(manifest))
