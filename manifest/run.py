"""``manifest capture``: snapshot, datasets, and (with a command) the run itself."""

from __future__ import annotations

from pathlib import Path

from manifest.capture import capture_snapshot
from manifest.errors import UsageError
from manifest.models import Manifest


def capture_from_cli(
    cwd: Path,
    *,
    command: list[str],
    seed: int | None,
    data: list[str] | None,
    outputs: list[str] | None,
    threads: int | None,
    deterministic: bool,
    store_dir: str | None,
    no_cache: bool,
    quiet: bool,
) -> tuple[Manifest, int]:
    if command:
        raise UsageError("running a command is not supported yet.")
    return capture_snapshot(cwd, store_dir=store_dir), 0
