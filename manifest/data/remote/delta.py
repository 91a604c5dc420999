"""Delta Lake tables: pins from the transaction log at one table version, no file read.

What the Delta log offers (Delta transaction protocol, ``add`` actions, checked
against deltalake 1.6): per data file its path (a URI relative to the table,
percent-encoded), its size, its modification time, partition values, and the
``stats`` the writer computed (record count, per-column minimum, maximum and
null count). A table version is the set of files whose ``add`` was not later
``remove``d; deltalake replays the log (JSON commits and parquet checkpoints)
and gives those as ``DeltaTable(path, version=V).get_add_actions()``.

Strength: a **version pin**. Data files are never rewritten in place (every
write adds files under fresh names), so version V of the table names fixed
bytes, but the log carries no checksum of them: the stats describe the rows,
they are not a digest of the file. ``--deep`` reads each file and records the
BLAKE3 tree root a local copy of the version's files gives: a content digest.
Each pin line: the decoded path relative to the table (what a copy holds), the
size, the table version, ``delta-stats`` and the BLAKE3 of the action's other
facts (modification time, partition values, stats) as canonical JSON.

A pinned version stays readable while its log entries and its files are kept:
``vacuum`` deletes files that a later version removed once they are older than
the retention (7 days by default), and log cleanup drops commits older than
the log retention (30 days). :func:`DeltaSource.drift` names each pinned file
that is no longer in the table's folder, and a table whose latest version
moved on when the URL named none (the run read the latest).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

import blake3

from manifest.data.listing import path_bytes
from manifest.data.remote.pins import ObjectPin, make_pin
from manifest.data.remote.source import CHUNK
from manifest.data.remote.url import RemoteURL, scrub
from manifest.errors import DataError

KIND = "delta-stats"
"""The checksum kind of a Delta pin: a digest of the log's facts, not of the bytes."""


class DeltaSource:
    def __init__(self, url: RemoteURL, endpoint: str | None, revision: str | None) -> None:
        import deltalake  # noqa: F401 (the extra is missing: ImportError names it)

        self.url = url
        self.endpoint = endpoint
        self.table = url.bucket
        self.recheck = revision is not None
        pinned = revision if revision is not None else url.revision
        self.version: int | None = int(pinned) if pinned is not None else None
        self.missing: list[str] = []

    def _load(self, version: int | None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        where = self.url.text()
        try:
            return DeltaTable(self.table, version=version)
        except TableNotFoundError:
            raise DataError(f"cannot read {where}: no Delta table at {self.table} (no "
                            "_delta_log with commits).") from None
        except Exception as exc:
            if version is None:
                raise _fail(exc, where, "read") from None
        latest = int(self._load(None).version())
        if version > latest:
            raise DataError(f"cannot read {where}: version {version} of the table was never "
                            f"written (the latest is {latest}).")
        raise DataError(f"cannot read {where}: the log no longer holds version {version} "
                        "(its commits were cleaned up after the log retention).")

    def list_pins(self, add: Callable[[ObjectPin], None], *, checksums: bool) -> str | None:
        table = self._load(self.version)
        version = int(table.version())
        self.version = version
        try:
            actions = table.get_add_actions(flatten=False)
            columns = {name: actions[name].to_pylist() for name in actions.column_names}
        except Exception as exc:
            raise _fail(exc, self.url.text(), "read the log of") from None
        rows: list[tuple[bytes, ObjectPin]] = []
        paths = columns.pop("path")
        sizes = columns.pop("size_bytes")
        for i, uri in enumerate(paths):
            rel = unquote(uri)
            if "://" in rel or rel.startswith("/") or any(
                    part in ("", ".", "..") for part in rel.split("/")):
                raise DataError(f"version {version} of {self.url.text()} names a file outside "
                                f"its folder ({scrub(rel)}): only tables that hold their "
                                "own files are pinned.")
            facts = {name: values[i] for name, values in columns.items()}
            digest = blake3.blake3(json.dumps(facts, sort_keys=True, default=str,
                                              separators=(",", ":")).encode()).hexdigest()
            raw = rel.encode("utf-8", "surrogateescape")
            rows.append((raw, make_pin(raw, int(sizes[i]), str(version), KIND, digest, None)))
        rows.sort(key=lambda row: row[0])
        for _, pin in rows:
            self._check_present(pin, version)
            add(pin)
        return str(version)

    def _file(self, pin: ObjectPin) -> str:
        return os.path.join(self.table, os.fsdecode(path_bytes(pin.key)))

    def _check_present(self, pin: ObjectPin, version: int) -> None:
        try:
            size = os.stat(self._file(pin)).st_size
        except FileNotFoundError:
            size = None
        if size == pin.size:
            return
        what = ("the file is no longer in the table's folder (vacuumed or deleted)"
                if size is None else f"the file holds {size} bytes, the log says {pin.size}")
        if not self.recheck:
            raise DataError(f"cannot pin version {version} of {self.url.text()}: it lists "
                            f"{pin.key}, and {what}.",
                            hint="Pin a version whose files are all kept.")
        self.missing.append(f"gone: {pin.key} (version {version} lists it; {what})"
                            if size is None else f"changed: {pin.key} ({what})")

    def drift(self) -> list[str]:
        lines = list(self.missing)
        if self.url.revision is None and self.version is not None:
            latest = int(self._load(None).version())
            if latest != self.version:
                lines.insert(0, f"the table's latest version is now {latest}, the run used "
                                f"{self.version} (the URL names no version: a re-run reads "
                                "the latest).")
        return lines

    def read(self, pin: ObjectPin) -> Iterator[bytes]:
        try:
            with open(self._file(pin), "rb") as handle:
                while chunk := handle.read(CHUNK):
                    yield chunk
        except OSError as exc:
            raise DataError(f"cannot read {pin.key} of {self.url.text()}: "
                            f"{exc.strerror or type(exc).__name__}.") from None

    def version_readable(self, pin: ObjectPin) -> bool:
        return os.path.isfile(self._file(pin))


def _fail(exc: BaseException, where: str, what: str) -> DataError:
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DataError(f"cannot {what} {where}: {scrub(message).rstrip('.')}.")
