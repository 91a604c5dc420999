"""The proof of a rebuild: each distribution's files against the run's record.

A rebuilt environment is the run's only if its files are: for each recorded
distribution, :func:`manifest.probes.distributions.prove_distribution` hashes the files
present in the rebuilt site-packages (not what their RECORD claims) and the digest is
compared with the one recorded at capture. Each distribution gets one status
(:class:`Status`, a stable code for JSON and a sentence for people):

* ``identical``: the same files;
* ``vanished``: no source serves its file any more (named before anything is built);
* ``built-here``: an sdist with no recorded hash (a wheel tag such as ``linux_x86_64``
  says pip or uv built it at install), an editable or local-path install, a VCS
  checkout: built from code, not fetched; the project's own checkout is rebuilt from the
  recorded code by the verb that re-runs it, so the rebuild does not install it and does
  not claim it. An sdist whose sha256 is recorded is built again from that same file when
  a source serves it, and then proven like a wheel (its reason says it was built here);
* ``other-build``: the same version with other files (another index's build, a wheel
  rebuilt, a file edited after install);
* ``unproven``: the record holds no content digest (an egg-info install), so nothing can
  be compared.

Besides the distributions, the proof lists every file in site-packages that no recorded
distribution's RECORD lists and a fresh ``uv venv`` does not write (:func:`unexpected_files`;
``__pycache__`` folders left out: a rebuilt venv's python runs with a private
``PYTHONPYCACHEPREFIX`` and never reads them): a planted ``.pth`` runs at every start, so
``unexpected files: ...`` fails the proof, and a distribution the record lacks is named.

:attr:`Proof.proven` is true only when every distribution is ``identical`` and nothing is
unexpected; the user sees
one line (:meth:`Proof.line`), "rebuilt: N distributions, files identical to the run's",
or what stands in the way, before any training starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from manifest.pyenv.sources import Pin, normalise


class Status(StrEnum):
    """One distribution's standing after a rebuild (exhaustive)."""

    IDENTICAL = "identical"
    VANISHED = "vanished"
    BUILT_HERE = "built-here"
    OTHER_BUILD = "other-build"
    UNPROVEN = "unproven"


_REASONS = {
    Status.IDENTICAL: "files identical to the run's",
    Status.VANISHED: "no source serves its file",
    Status.BUILT_HERE: "built from code (sdist, local path, editable or VCS), not fetched",
    Status.OTHER_BUILD: "the same version with other files",
    Status.UNPROVEN: "the record holds no digest of its files",
}


@dataclass(frozen=True)
class Finding:
    name: str
    version: str
    status: Status
    reason: str


@dataclass(frozen=True)
class Proof:
    """Every rebuilt distribution's status; :attr:`built` is false when nothing was built."""

    findings: tuple[Finding, ...]
    built: bool
    unexpected: tuple[str, ...] = ()
    """Files in site-packages no recorded distribution installed (:func:`unexpected_files`)."""

    @property
    def proven(self) -> bool:
        return self.built and not self.unexpected and all(
            f.status is Status.IDENTICAL for f in self.findings)

    def differing(self) -> list[Finding]:
        return [f for f in self.findings if f.status is not Status.IDENTICAL]

    def line(self) -> str:
        """The one line for the user."""
        n = len(self.findings)
        if self.unexpected:
            shown = ", ".join(self.unexpected[:5]) + (
                f" and {len(self.unexpected) - 5} more" if len(self.unexpected) > 5 else "")
            return f"not proven: unexpected files: {shown}"
        if self.proven:
            return f"rebuilt: {n} distribution{'s' if n != 1 else ''}, files identical to " \
                   "the run's"
        counts: dict[str, int] = {}
        for f in self.differing():
            counts[f.status.value] = counts.get(f.status.value, 0) + 1
        said = ", ".join(f"{c} {s}" for s, c in sorted(counts.items()))
        if not self.built:
            return f"not rebuilt: {said}; no environment was built"
        return f"not proven: {n - sum(counts.values())} of {n} identical, {said}"

    def to_json(self) -> dict[str, Any]:
        return {"proven": self.proven, "built": self.built, "line": self.line(),
                "distributions": [{"name": f.name, "version": f.version,
                                   "status": f.status.value, "reason": f.reason}
                                  for f in self.findings],
                "unexpected": list(self.unexpected)}

    @classmethod
    def from_json(cls, data: Any) -> Proof | None:
        """A proof kept in a cache stamp, or None if it is not one."""
        try:
            findings = tuple(Finding(str(d["name"]), str(d["version"]), Status(d["status"]),
                                     str(d["reason"])) for d in data["distributions"])
            unexpected = tuple(str(u) for u in data.get("unexpected") or ())
            return cls(findings, bool(data["built"]), unexpected)
        except (KeyError, TypeError, ValueError):
            return None


def finding(pin: Pin, status: Status, reason: str | None = None) -> Finding:
    return Finding(pin.name, pin.version, status, reason or _REASONS[status])


def site_packages(venv: Path) -> Path:
    """The venv's purelib folder (``lib/pythonX.Y/site-packages``)."""
    found = sorted(venv.glob("lib/python*/site-packages"))
    if not found:
        raise FileNotFoundError(venv / "lib")
    return found[0]


def _dist_infos(site: Path) -> dict[str, tuple[str, Path]]:
    out: dict[str, tuple[str, Path]] = {}
    for entry in site.glob("*.dist-info"):
        m = re.fullmatch(r"(.+)-([^-]+)\.dist-info", entry.name)
        if m:
            out[normalise(m[1])] = (m[2], entry)
    return out


def _record_paths(dist_info: Path, site: Path) -> set[str]:
    """The paths a distribution's RECORD lists, relative to ``site`` (its own RECORD too)."""
    import csv

    out = {os.path.relpath(dist_info / "RECORD", site)}
    try:
        with (dist_info / "RECORD").open(encoding="utf-8", newline="") as fh:
            for row in csv.reader(fh):
                if row and row[0]:
                    out.add(os.path.normpath(row[0]))
    except (OSError, UnicodeDecodeError, csv.Error):
        pass
    return out


def file_sha256(path: Path) -> str:
    import hashlib

    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def unexpected_files(site: Path, pins: list[Pin], base: Mapping[str, str]) -> tuple[str, ...]:
    """Every file (or link) under ``site`` that no recorded distribution's RECORD lists and
    that is not one of ``base`` (what a fresh ``uv venv`` writes there: path to sha256) with
    its content, ``__pycache__`` folders left out; a distribution the record lacks is named
    by its ``.dist-info``. A walk and a read of each RECORD: ~0.1 s for torch's ~15,000
    files."""
    wanted = {p.name for p in pins}
    out: list[str] = []
    listed: set[str] = set()
    for name, (_version, info) in _dist_infos(site).items():
        if name in wanted:
            listed |= _record_paths(info, site)
        else:
            out.append(f"{info.name} (a distribution not in the record)")
    for folder, dirs, files in os.walk(site):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links]
        for name in [*files, *links]:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, site)
            if rel in listed:
                continue
            if rel in base and not os.path.islink(path) and file_sha256(Path(path)) == base[rel]:
                continue
            out.append(rel)
    return tuple(sorted(out))


def prove_pins(site: Path, pins: list[Pin], *, vanished: frozenset[str] = frozenset(),
               base: Mapping[str, str] | None = None) -> Proof:
    """Compare each pin's recorded digest with the files in ``site`` (a rebuilt venv's),
    and, given ``base`` (:func:`unexpected_files`), list the files nothing recorded put
    there."""
    from manifest.probes.distributions import prove_distribution

    present = _dist_infos(site)
    findings = []
    for pin in pins:
        if pin.kind == "self":  # this tool: left out of every rebuild on purpose
            continue
        if pin.name in vanished:
            findings.append(finding(pin, Status.VANISHED, _vanished_reason(pin)))
            continue
        if pin.kind == "built-here":
            findings.append(finding(pin, Status.BUILT_HERE, pin.why))
            continue
        if pin.files is None:
            findings.append(finding(pin, Status.UNPROVEN))
            continue
        installed = present.get(pin.name)
        if installed is None:
            findings.append(finding(pin, Status.OTHER_BUILD, "not installed by the rebuild"))
            continue
        version, dist_info = installed
        digest = prove_distribution(dist_info, site)
        if digest == pin.files:
            findings.append(finding(pin, Status.IDENTICAL, _SDIST_IDENTICAL
                                    if pin.kind == "sdist" else None))
        elif pin.kind == "sdist" and version == pin.version:
            findings.append(finding(pin, Status.OTHER_BUILD, _SDIST_OTHER))
        elif version != pin.version:
            findings.append(finding(pin, Status.OTHER_BUILD,
                                    f"version {version} installed, {pin.version} recorded"))
        else:
            findings.append(finding(pin, Status.OTHER_BUILD))
    unexpected = unexpected_files(site, pins, base) if base is not None else ()
    return Proof(tuple(findings), built=True, unexpected=unexpected)


def not_built(pins: list[Pin], vanished: frozenset[str]) -> Proof:
    """The proof of a rebuild refused before it started: the vanished named, nothing built."""
    return Proof(tuple(finding(p, Status.VANISHED, _vanished_reason(p)) for p in pins
                       if p.name in vanished), built=False)


_SDIST_IDENTICAL = ("built here from its recorded sdist (sha256 as recorded); files "
                    "identical to the run's")
_SDIST_OTHER = ("built here from its recorded sdist (sha256 as recorded), with other files "
                "than the run's: its build is not reproducible")


def _vanished_reason(pin: Pin) -> str | None:
    if pin.kind == "sdist":
        return (f"built here from an sdist, and no source serves {pin.sdist_name} with the "
                "recorded sha256")
    return None
