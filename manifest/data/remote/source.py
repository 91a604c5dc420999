"""What every provider offers the pinning, the deep read and the re-check.

One class per provider (``s3``, ``gcs``, ``hf``, ``delta``), each importing its
client library only when constructed, so ``manifest --help`` and ``diff`` never
load boto3, google-cloud-storage, huggingface_hub or deltalake. This module is the
floor the providers stand on (the protocol, the read size, the progress line); which
class serves which scheme is a table of import paths in
:mod:`manifest.data.remote.registry`, which imports a provider on first use. The
providers import from here and never from the registry, so no import runs back up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Protocol

from manifest.data.remote.pins import ObjectPin
from manifest.data.remote.url import RemoteURL

CHUNK = 1 << 20
"""Bytes per read of an object body under ``--deep``: memory is workers × CHUNK."""


class Source(Protocol):
    url: RemoteURL
    endpoint: str | None

    def list_pins(self, add: Callable[[ObjectPin], None], *, checksums: bool) -> str | None:
        """Call ``add`` with every object's pin in key order; return the resolved revision."""

    def read(self, pin: ObjectPin) -> Iterator[bytes]:
        """The bytes of exactly the pinned object (its version, or its ETag), in chunks."""

    def version_readable(self, pin: ObjectPin) -> bool:
        """Whether the pinned version of an object can still be read (no body is read)."""

    def drift(self) -> list[str]:
        """After a re-check's listing: what moved besides the objects, one line each
        (a Hub branch that points elsewhere now, a Delta table's vacuumed files)."""


class ProgressSink(Protocol):
    """Where a progress line goes: the CLI renders it (``manifest.cli.verbs_record``); the
    library only says what the line is."""

    live: bool
    """A terminal that redraws one line in place; otherwise every line is kept (a log)."""

    def __call__(self, text: str | None) -> None:
        """Show ``text`` as the progress line; None: the progress is over."""


class Progress:
    """Objects and bytes so far, handed to ``show`` at most once a second, after the first
    second (a listing that ends sooner shows nothing). Without ``show``, nothing is shown."""

    def __init__(self, label: str, show: ProgressSink | None, total: int | None = None) -> None:
        self.label = label
        self.show = show
        self.total = total
        self.objects = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._next = self.started + 1.0
        self._shown = False

    def __call__(self, objects: int, nbytes: int) -> None:
        self.objects += objects
        self.bytes += nbytes
        now = time.monotonic()
        if self.show is not None and now >= self._next:
            self._next = now + 1.0
            self._show(self.show, now)

    def _show(self, show: ProgressSink, now: float) -> None:
        of = f"/{self.total:,}" if self.total is not None else ""
        rate = self.bytes / max(now - self.started, 1e-9) / 1e6
        show(f"{self.label}: {self.objects:,}{of} objects, {self.bytes / 1e9:.2f} GB, "
             f"{rate:.0f} MB/s")
        self._shown = True

    def close(self) -> None:
        if self._shown and self.show is not None:
            self.show(None)
