"""Which files make two node records' uncommitted changes differ.

Merge refuses node records whose ``code`` differs. ``code.diff_digest`` alone
says only that the patches differ; the user needs the files. Each patch is
read from the local blob store (never from a location a record names), split
per file at its ``diff --git a/… b/…`` headers, and the two are compared file by
file. In one shared checkout (the usual multi-node set-up) every node's patch is
in the same store; a patch that is not there is said, not guessed.

The usual cause is a file the run itself writes into the repository while the
other node captures: a log redirected into the checkout is an untracked file,
and untracked files are code (they may be imported). The fix is to write logs
outside the repository or into a directory git ignores.
"""

from __future__ import annotations

import re

from manifest.models import Manifest
from manifest.store import BlobStore

_HEADER = re.compile(rb"^diff --git a/(.*?) b/(.*)$", re.MULTILINE)
SHOWN = 10
"""Files named in a refusal; the rest are counted."""


def files_of(patch: bytes) -> dict[str, bytes]:
    """Path → that file's part of a ``git diff --binary`` patch (headers included)."""
    starts = list(_HEADER.finditer(patch))
    parts: dict[str, bytes] = {}
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(patch)
        path = match.group(2).decode("utf-8", "replace")
        parts[path] = patch[match.start():end]
    return parts


def differing_files(a: bytes, b: bytes) -> list[str]:
    """Files changed in one patch and not the other, or changed differently, sorted."""
    one, two = files_of(a), files_of(b)
    return sorted(p for p in one.keys() | two.keys() if one.get(p) != two.get(p))


def code_difference(a: Manifest, b: Manifest, store: BlobStore | None) -> str | None:
    """A sentence naming the files whose uncommitted changes differ between ``a`` and
    ``b``, or None when the records agree on the patch (another code field differs)."""
    da, db = a.code.diff_digest, b.code.diff_digest
    if da == db or a.code.commit != b.code.commit:
        return None
    patches = [store.get(d) if store is not None and d else b"" for d in (da, db)]
    if any(p is None for p in patches):
        return ("their uncommitted changes differ; the patches are not in this "
                "repository's store, so the files cannot be named here (run merge in the "
                "checkout the nodes captured from, or compare the nodes' `git status`)")
    files = differing_files(patches[0] or b"", patches[1] or b"")
    if not files:
        return None
    shown = ", ".join(files[:SHOWN]) + (f" and {len(files) - SHOWN} more"
                                         if len(files) > SHOWN else "")
    return f"their uncommitted changes differ in {len(files)} file(s): {shown}"
