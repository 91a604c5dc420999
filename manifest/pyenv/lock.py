"""The recorded environment as a standard lock: PEP 751 ``pylock.toml``.

The lock is the form in which a run's environment leaves this tool: ``uv pip install -r
pylock.toml`` (uv >= 0.6.15; experimental there) and ``pip install -r pylock.toml``
(pip >= 26.1, experimental; pip 25.1-26.0 can write a lock but not install one) read it
without manifest. What it holds, for each distribution a rebuild installs
(``manifest.pyenv.sources.rebuild_set``):

* ``name`` and ``version`` (the local label kept: ``2.13.0+cpu`` is the CPU build);
* ``index``: the simple index that serves its wheel, when one does (not a find-links
  folder);
* ``[[packages.wheels]]`` with ``name``, ``url`` and ``hashes`` for the wheel the sources
  serve (``manifest.pyenv.archives``: PEP 751 requires a hash and a location per wheel,
  and an installed distribution records neither, so the lock is written against the
  sources a rebuild would use);
* ``[packages.vcs]`` (``type``, ``url``, ``commit-id``) or ``[packages.directory]``
  (``path``, ``editable``) for a PEP 610 record: built from code by the installer;
* ``[packages.tool.manifest]``: the recorded content digest (``files``), what
  ``manifest env build`` proves a rebuild against.

This tool (torch-manifest) is left out on purpose, and so are its own dependencies that
the run never imported (pydantic, blake3, rich …): they cannot change the run's bits. A
distribution no source serves is not written as a package an installer would fail on;
:class:`Lock` names it (``vanished``), and the CLI refuses to write a partial lock.

No TOML writer is a dependency of this tool, so :func:`dumps` writes this fixed shape
itself: basic strings with every control character escaped, tables and arrays of tables
in one order; a test reads every lock back with ``tomllib``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.pyenv.archives import Archive, locate
from manifest.pyenv.sources import Pin, SourcePlan, plan_sources

if TYPE_CHECKING:
    from manifest.models import Manifest
    from manifest.trust import TrustDecision

CREATED_BY = "torch-manifest"


@dataclass(frozen=True)
class Lock:
    text: str
    """The ``pylock.toml`` document."""
    packages: int
    vanished: tuple[str, ...]
    """``name==version`` of each distribution no source serves (not in the lock)."""
    left_out: tuple[str, ...]
    """What was left out on purpose, with why (this tool)."""
    plan: SourcePlan


def _string(value: str) -> str:
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def _key(key: str) -> str:
    bare = key.replace("-", "").replace("_", "").isalnum() and key.isascii()
    return key if bare else _string(key)


def dumps(document: dict[str, Any]) -> str:
    """TOML for a lock's shape: top-level scalars, ``[[packages]]`` with scalar keys,
    ``[[packages.wheels]]``, ``[packages.vcs]``/``[packages.directory]`` and
    ``[packages.tool.manifest]`` tables, and a ``[tool.manifest]`` table."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in document.items()
             if not isinstance(v, list | dict)]
    for package in document.get("packages", []):
        lines += ["", "[[packages]]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in package.items()
                  if not isinstance(v, list | dict)]
        for table in ("vcs", "directory", "sdist"):
            if table in package:
                lines += [f"[packages.{table}]"]
                lines += [f"{_key(k)} = {_value(v)}" for k, v in package[table].items()]
        for wheel in package.get("wheels", []):
            lines += ["[[packages.wheels]]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in wheel.items()]
        for tool, table in package.get("tool", {}).items():
            lines += [f"[packages.tool.{_key(tool)}]"]
            lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    for tool, table in document.get("tool", {}).items():
        lines += ["", f"[tool.{_key(tool)}]"]
        lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _package(pin: Pin, archive: Archive | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": pin.name, "version": pin.version}
    if pin.kind == "built-here" and pin.vcs:
        url = pin.url or ""
        scheme = url.split("://", 1)[0]
        entry["vcs"] = {"type": pin.vcs.get("vcs", "git"),
                        "url": url.split("+", 1)[1] if "+" in scheme else url,
                        "commit-id": pin.vcs["commit_id"]}
    elif pin.kind == "built-here":
        from urllib.parse import unquote, urlsplit

        url = pin.url or ""
        path = unquote(urlsplit(url).path) if url.startswith("file:") else url
        entry["directory"] = {"path": path, "editable": pin.editable}
    elif pin.kind == "sdist" and archive is not None:
        if archive.index:
            entry["index"] = archive.index
        entry["sdist"] = {"name": archive.filename, "url": archive.url,
                          "hashes": {"sha256": archive.sha256 or pin.sha256}}
    else:
        if archive is not None and archive.index:
            entry["index"] = archive.index
        if archive is not None:
            wheel: dict[str, Any] = {"name": archive.filename, "url": archive.url}
            if archive.sha256:
                wheel["hashes"] = {"sha256": archive.sha256}
            entry["wheels"] = [wheel]
    if pin.files:
        entry["tool"] = {"manifest": {"files": pin.files}}
    return entry


def build_lock(manifest: Manifest, *, trust: TrustDecision,
               find_links: Iterable[str | Path] = (), index_urls: Iterable[str] = (),
               tree: Path | None = None) -> Lock:
    """The lock for ``manifest``'s environment against the plan's sources."""
    from manifest.pyenv.rebuild import recorded_pins

    pins = recorded_pins(manifest, tree)
    plan = plan_sources(manifest.env.sources, find_links=find_links, index_urls=index_urls,
                        trust=trust, tree=tree, pins=pins)
    packages = []
    vanished = []
    left_out = []
    for pin in pins:
        if pin.kind == "self":
            left_out.append(f"{pin.name}=={pin.version}: this tool, not part of the run")
            continue
        if pin.kind == "built-here" and not pin.url:  # an sdist an index served: no hash
            left_out.append(f"{pin.name}=={pin.version}: {pin.why}")
            continue
        fetched = pin.kind in ("index", "archive", "sdist")
        archive = locate(pin, plan) if fetched else None
        if fetched and archive is None:
            vanished.append(f"{pin.name}=={pin.version}")
            continue
        packages.append(_package(pin, archive))
    document: dict[str, Any] = {
        "lock-version": "1.0",
        "created-by": CREATED_BY,
        "requires-python": f"=={manifest.env.python}",
        "packages": packages,
        "tool": {"manifest": {"run-id": manifest.run_id,
                              **({"environment-digest": manifest.env.environment_digest}
                                 if manifest.env.environment_digest else {})}},
    }
    return Lock(dumps(document), len(packages), tuple(vanished), tuple(left_out), plan)
