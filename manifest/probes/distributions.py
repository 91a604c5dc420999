"""Each installed distribution by content: what rebuilding needs, and what proves a rebuild.

Per importable distribution (:func:`probe_distributions`): the exact version
(local label kept, ``2.13.0+cpu``), the wheel tags from ``WHEEL``, the
installer, PEP 610 ``direct_url.json`` (credentials stripped), and a content
digest of its files (:func:`record_digest`).

The content digest is ``blake3`` over the distribution's ``RECORD`` lines
(``path,algo=hash``, sorted, one per line) for the files that lie inside
site-packages, leaving out what an installer writes of its own: ``INSTALLER``,
``REQUESTED``, ``direct_url.json``, ``RECORD`` (and its signatures),
``uv_cache.json``/``uv_build.json``, ``__pycache__`` and ``*.pyc``, and
anything outside site-packages (console scripts, whose shebang names the venv,
and headers or data under ``../../..``). Measured on the same wheels: pip,
uv-hardlink and uv-copy installs give the same digest; a hash of the tree would
not (shebangs, bytecode). Capture takes the hashes RECORD already holds and
re-hashes nothing, so it costs one file read per distribution
(``benchmarks/capture_env.py``).

:func:`prove_distribution` is the proof side: the same digest computed from
the bytes of the files actually present, so a rebuilt environment is proven
against the record even where its own RECORD lies. An honest install gives
exactly the recorded digest; an edited, missing or other-build file does not.

Where distributions can come from (:func:`probe_sources`): the indexes and
find-links pip and uv were configured with at capture (their config files
and environment variables), credentials stripped. Options given on an
installer's command line at install time leave no trace, so the origin says
which files and variables were read.

Longer than 500 lines because the record (capture) and the proof (a rebuild) must
filter RECORD lines by one rule, kept in one place, and the pip and uv source readers
share the credential stripping; each part is under 200 lines.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import blake3

from manifest.models import DirectUrl, Distribution, Sources
from manifest.redact import strip_url_credentials

DistributionRecord = Distribution
"""What :func:`probe_distributions` returns per distribution (the model itself)."""

FILES_FORMAT = "manifest-record/v1"
"""Prefix hashed before the lines, so a change of the line format renames every digest."""

INSTALLER_FILES = frozenset({
    "INSTALLER", "REQUESTED", "direct_url.json", "RECORD", "RECORD.jws", "RECORD.p7s",
    "uv_cache.json", "uv_build.json",
})
"""Files an installer writes into ``*.dist-info`` of its own (not from the wheel)."""

PYPI_SIMPLE = "https://pypi.org/simple"

_DIST_SUFFIXES = (".dist-info", ".egg-info")

SELF = "manifest"
"""Our own distribution is left out: its version is in observed, not identity."""

_NORMALISE = re.compile(r"[-_.]+")


def normalise_name(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return _NORMALISE.sub("-", name).lower()


def _metadata_headers(path: Path) -> tuple[str, str] | None:
    """Name and Version from a distribution's metadata file, without the email parser.

    Core metadata is RFC 822 headers; Name and Version are single-line fields
    that come first, so reading up to the first blank line suffices.
    """
    if path.is_dir():
        for candidate in ("METADATA", "PKG-INFO"):
            if (path / candidate).is_file():
                path = path / candidate
                break
        else:
            return None
    name = version = None
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                break
            key, sep, value = line.partition(":")
            if not sep or line[0] in " \t":
                continue
            key = key.strip().lower()
            if key == "name" and name is None:
                name = value.strip()
            elif key == "version" and version is None:
                version = value.strip()
    if not name or not version:
        return None
    return normalise_name(name), version


def distribution_paths() -> list[str]:
    """``sys.path`` minus the entry Python put first for the script or ``-m``/``-c`` (cwd).

    That entry depends on how manifest was started (console script, ``python
    -m``, from which directory), not on what is installed; an ``*.egg-info``
    lying in the working directory must not change the run's identity.
    """
    if sys.flags.safe_path:
        return list(sys.path)
    return list(sys.path[1:])


def dist_name_version(site: Path, dirname: str) -> tuple[str, str] | None:
    """Normalised name and version of the ``*.dist-info``/``*.egg-info`` ``dirname`` in ``site``.

    Read from the ``name-version.dist-info`` directory name, which installers
    write from the metadata (wheel spec: name normalised with ``_``, so
    exactly one ``-``); anything else (egg-info of develop installs, unusual
    names) is read from its metadata headers.
    """
    stem = dirname.rsplit(".", 1)[0]
    parts = stem.split("-")
    if dirname.endswith(".dist-info") and len(parts) == 2 and all(parts):
        return normalise_name(parts[0]), parts[1]
    try:
        return _metadata_headers(site / dirname)
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------ RECORD


def _record_lines(record: Path) -> list[bytes]:
    """RECORD's lines (bytes, line ends dropped, empty lines skipped)."""
    return [line for line in record.read_bytes().splitlines() if line]


def _parse(line: bytes) -> tuple[str, str, str]:
    """``(path, hash, size)`` of one RECORD line (CSV; quoted only where a path needs it)."""
    import csv

    text = line.decode("utf-8", "surrogateescape")
    fields = next(csv.reader([text]), []) if '"' in text else text.rsplit(",", 2)
    fields += [""] * (3 - len(fields))
    return fields[0], fields[1], fields[2]


def _unparse(path: str, digest: str, size: str) -> bytes:
    """A RECORD line as pip and uv write it (``csv`` minimal quoting)."""
    import csv

    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([path, digest, size])
    return out.getvalue().encode("utf-8", "surrogateescape")


def _content_lines(dist_info_dir: Path, site_dir: Path) -> list[bytes] | None:
    """RECORD's lines for the distribution's content inside site-packages, verbatim.

    Left out: paths that leave site-packages (``../``, ``/../`` or absolute:
    console scripts, headers; so the proof never reads outside site-packages),
    ``__pycache__``/``*.pyc``, and the installer's files in the dist-info
    directory (:data:`INSTALLER_FILES`). Lines are kept verbatim (pip and uv
    write the same bytes for the same file), which makes the filter a few byte
    tests per line: 80,000 lines in ~40 ms here.
    """
    try:
        lines = _record_lines(dist_info_dir / "RECORD")
    except OSError:
        return None
    own = dist_info_dir.name.encode("utf-8", "surrogateescape") + b"/"
    kept = [line for line in lines
            if not line.startswith((b"../", b"/", b'"../', b'"/', b"..\\"))
            and b"__pycache__" not in line and b".pyc," not in line and b"/../" not in line]
    bookkeeping = {own + name.encode() for name in INSTALLER_FILES}
    return [line for line in kept
            if not line.startswith(own) or _parse(line)[0].encode(
                "utf-8", "surrogateescape") not in bookkeeping]


def _digest(lines: list[bytes]) -> str:
    lines.sort()
    h = blake3.blake3(FILES_FORMAT.encode() + b"\n")
    h.update(b"\n".join(lines))
    return "blake3:" + h.hexdigest()


def record_digest(dist_info_dir: Path, site_dir: Path) -> str | None:
    """``blake3:<hex>`` of the distribution's content lines in its RECORD (module docstring).

    None when there is no readable RECORD (egg-info, some editable installs):
    the env probe stores :data:`NO_RECORD` for it in ``env.unavailable``.
    """
    lines = _content_lines(dist_info_dir, site_dir)
    return None if lines is None else _digest(lines)


NO_RECORD = ("no RECORD lists its files (an egg-info, or an editable install by an old "
             "installer): its version is recorded, its files are not")
"""The reason stored in ``env.unavailable`` for a distribution whose files are None."""


def _file_facts(path: Path, algo: str) -> tuple[str, str]:
    """``(algo=urlsafe-b64-nopad, size)`` of a file's bytes; ``("missing", "")`` if unreadable."""
    h = hashlib.new(algo)
    size = 0
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except OSError:
        return "missing", ""
    return f"{algo}=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii"), \
        str(size)


def prove_distribution(dist_info_dir: Path, site_dir: Path) -> str | None:
    """The digest of :func:`record_digest` computed from the bytes on disk, not from RECORD.

    Each content line of RECORD is rebuilt from the file present in
    ``site_dir``: its hash with the line's own algorithm (sha256 unless RECORD
    names another that hashlib guarantees) and its size; a missing file reads
    ``missing``. An honest install reproduces every line, so the digest equals
    the recorded one; an edited, missing or other-build file changes it.
    None without a readable RECORD.
    """
    lines = _content_lines(dist_info_dir, site_dir)
    if lines is None:
        return None
    proven: list[bytes] = []
    for line in lines:
        path, recorded, _ = _parse(line)
        algo = recorded.partition("=")[0] or "sha256"
        if algo not in hashlib.algorithms_guaranteed:
            algo = "sha256"
        proven.append(_unparse(path, *_file_facts(site_dir / path, algo)))
    return _digest(proven)


# --------------------------------------------------------------- metadata


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def wheel_tags(dist_info_dir: Path) -> list[str]:
    """The ``Tag:`` lines of ``WHEEL`` in file order; [] for egg-info or none."""
    text = _read_text(dist_info_dir / "WHEEL")
    if text is None:
        return []
    return [value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())
            if key.strip().lower() == "tag" and value.strip()]


def _table(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def read_direct_url(dist_info_dir: Path) -> DirectUrl | None:
    """PEP 610 ``direct_url.json`` with credentials stripped from the URL; None if absent/bad."""
    text = _read_text(dist_info_dir / "direct_url.json")
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        return None
    dir_info = _table(data, "dir_info")
    vcs_info = _table(data, "vcs_info")
    archive = _table(data, "archive_info")
    archive_hash: str | None = None
    hashes = archive.get("hashes")
    if isinstance(hashes, dict) and isinstance(hashes.get("sha256"), str):
        archive_hash = "sha256=" + hashes["sha256"]
    elif isinstance(archive.get("hash"), str) and "=" in archive["hash"]:
        archive_hash = archive["hash"]
    vcs = vcs_info.get("vcs")
    commit = vcs_info.get("commit_id")
    return DirectUrl(
        url=strip_url_credentials(data["url"]),
        editable=dir_info.get("editable") is True,
        vcs=vcs if isinstance(vcs, str) else None,
        commit_id=commit if isinstance(commit, str) else None,
        archive_hash=archive_hash,
    )


def _installer(dist_info_dir: Path) -> str | None:
    text = _read_text(dist_info_dir / "INSTALLER")
    return text.strip() or None if text is not None else None


def describe(name: str, version: str, dist_info_dir: Path, site_dir: Path) -> Distribution:
    """The record of one distribution found at ``dist_info_dir`` under ``site_dir``."""
    is_wheel_install = dist_info_dir.name.endswith(".dist-info")
    return Distribution(
        version=version,
        tags=wheel_tags(dist_info_dir) if is_wheel_install else [],
        installer=_installer(dist_info_dir),
        direct_url=read_direct_url(dist_info_dir) if is_wheel_install else None,
        files=record_digest(dist_info_dir, site_dir) if is_wheel_install else None,
    )


def locate_distributions(paths: Iterable[str]) -> dict[str, tuple[str, Path, Path]]:
    """``{normalised name: (version, dist-info dir, site dir)}``, first on the path wins.

    The same precedence and parsing as
    :func:`manifest.probes.env.installed_distributions` (which is this
    function without the paths); the tool's own distribution is left out.
    """
    found: dict[str, tuple[str, Path, Path]] = {}
    for entry in paths:
        try:
            with os.scandir(entry or ".") as it:
                names = sorted(e.name for e in it if e.name.endswith(_DIST_SUFFIXES))
        except OSError:
            continue
        site = Path(entry or ".")
        for dirname in names:
            parsed = dist_name_version(site, dirname)
            if parsed is not None and parsed[0] not in found and parsed[0] != SELF:
                found[parsed[0]] = (parsed[1], site / dirname, site)
    return found


CACHE_FORMAT = "manifest-distributions-cache/v1"

def default_cache_file(paths: Iterable[str] = (),
                       environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/manifest/distributions/<blake3 of paths>.json`` (``~/.cache``).

    One file per environment (its list of site directories), so a capture reads
    only its own records whatever the number of venvs captured on the machine.
    """
    env = os.environ if environ is None else environ
    base = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME", "~")).expanduser() / ".cache")
    key = blake3.blake3("\0".join(paths).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return base / "manifest" / "distributions" / f"{key}.json"


def _stamp(dist_info: str) -> list[int] | None:
    """What changes when an installer touches a distribution: its RECORD's stat.

    Installers write RECORD last, after INSTALLER and ``direct_url.json``
    (pip, uv), so an install, upgrade or reinstall gives a new inode or mtime.
    """
    try:
        record = os.stat(dist_info + "/RECORD")
    except OSError:
        return None
    return [record.st_dev, record.st_ino, record.st_size, record.st_mtime_ns]


def _load_cache(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _save_cache(path: Path, entries: dict[str, object]) -> None:
    """Write the cache atomically; a cache that cannot be written is simply not kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": CACHE_FORMAT, "entries": entries},
                                  separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return


def probe_distributions(paths: Iterable[str] | None = None, *,
                        cache_file: Path | None = None, use_cache: bool = True,
                        located: Mapping[str, tuple[str, Path, Path]] | None = None,
                        ) -> dict[str, Distribution]:
    """The record of each importable distribution (see the module docstring).

    Over :func:`distribution_paths` unless ``paths`` is given. Reading every
    RECORD costs ~80 ms CPU on a 220-distribution venv with torch (80,000
    lines), against a capture of ~0.2 s, so each record is kept in the
    environment's cache file (:func:`default_cache_file`) under the stat of its
    RECORD (device, inode, size, mtime in ns): any install, upgrade or
    reinstall rewrites RECORD and so misses the cache, and a warm probe pays a
    stat per distribution (~5 ms CPU in all, ``benchmarks/capture_env.py``).
    The cache only saves reading RECORD again; the proof
    (:func:`prove_distribution`) never uses it. ``located`` is
    :func:`locate_distributions` of ``paths`` when the caller has it already (the env
    probe lists the names from it: one scan of the site directories, ~1.1 ms, not two).
    """
    where = distribution_paths() if paths is None else list(paths)
    if located is None:
        located = locate_distributions(where)
    store = (cache_file or default_cache_file(where)) if use_cache else None
    cached = _load_cache(store) if store is not None else {}
    fresh: dict[str, object] = {}
    out: dict[str, Distribution] = {}
    for name, (version, dist_info, site) in sorted(located.items()):
        key = str(dist_info)
        stamp = _stamp(key) if store is not None else None
        hit = cached.get(key)
        record: Distribution | None = None
        if stamp is not None and isinstance(hit, dict) and hit.get("stamp") == stamp:
            try:
                record = Distribution.model_validate(hit.get("record"))
            except ValueError:
                record = None
            if record is not None and record.version == version:
                fresh[key] = hit
            else:
                record = None
        if record is None:
            record = describe(name, version, dist_info, site)
            if stamp is not None:
                fresh[key] = {"stamp": stamp, "record": record.model_dump(mode="json")}
        out[name] = record
    if store is not None and fresh != cached:
        _save_cache(store, fresh)
    return out


def environment_digest(distributions: Mapping[str, Distribution]) -> str:
    """One ``blake3:`` over (name, version, files) of every distribution, in name order."""
    lines = sorted(f"{name} {d.version} {d.files or '-'}" for name, d in distributions.items())
    return "blake3:" + blake3.blake3("\n".join(lines).encode("utf-8")).hexdigest()


# ----------------------------------------------------------------- sources


def _split(value: str) -> list[str]:
    return [part for part in value.replace(",", " ").split() if part]


def _clean(urls: Iterable[str]) -> list[str]:
    out: list[str] = []
    for url in urls:
        cleaned = strip_url_credentials(url.strip())
        if cleaned and cleaned not in out:
            out.append(cleaned)
    return out


def _pip_config_files(environ: Mapping[str, str], etc: Path) -> list[Path]:
    """pip's configuration files in its load order (global, user, site; later wins).

    As pip documents: ``/etc/pip.conf`` then ``$XDG_CONFIG_DIRS/pip/pip.conf``
    (default ``/etc/xdg``); ``~/.pip/pip.conf`` then
    ``$XDG_CONFIG_HOME/pip/pip.conf``; ``sys.prefix/pip.conf``.
    ``PIP_CONFIG_FILE`` is read last; set to ``os.devnull`` it disables all.
    """
    given = environ.get("PIP_CONFIG_FILE")
    if given == os.devnull:
        return []
    home = Path(environ.get("HOME", "~")).expanduser()
    xdg_dirs = environ.get("XDG_CONFIG_DIRS") or str(etc / "xdg")
    xdg_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    files = [etc / "pip.conf"]
    files += [Path(d) / "pip" / "pip.conf" for d in reversed(xdg_dirs.split(os.pathsep)) if d]
    files += [home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf",
              Path(sys.prefix) / "pip.conf"]
    if given:
        files.append(Path(given))
    return files


def _uv_config_files(environ: Mapping[str, str], etc: Path, cwd: Path) -> list[Path]:
    """uv's configuration files, system then user then project (later wins).

    ``UV_CONFIG_FILE`` replaces them all; ``UV_NO_CONFIG`` disables them.
    The project file is the nearest ``uv.toml`` or ``pyproject.toml`` with a
    ``[tool.uv]`` table from ``cwd`` up.
    """
    if environ.get("UV_NO_CONFIG"):
        return []
    if environ.get("UV_CONFIG_FILE"):
        return [Path(environ["UV_CONFIG_FILE"])]
    home = Path(environ.get("HOME", "~")).expanduser()
    xdg_dirs = environ.get("XDG_CONFIG_DIRS") or str(etc / "xdg")
    xdg_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    files = [etc / "uv" / "uv.toml"]
    files += [Path(d) / "uv" / "uv.toml" for d in reversed(xdg_dirs.split(os.pathsep)) if d]
    files.append(xdg_home / "uv" / "uv.toml")
    for folder in (cwd, *cwd.parents):
        if (folder / "uv.toml").is_file():
            files.append(folder / "uv.toml")
            break
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "[tool.uv" in (_read_text(pyproject) or ""):
            files.append(pyproject)
            break
    return files


class _Found:
    def __init__(self) -> None:
        self.index: list[str] = []
        self.extra: list[str] = []
        self.find_links: list[str] = []
        self.origin: list[str] = []
        self.no_index = False


_PIP_SOURCE_KEYS = re.compile(r"index-url|find-links|no-index", re.IGNORECASE)


def _read_pip(path: Path, found: _Found) -> None:
    try:
        raw = path.read_bytes()
    except OSError:
        return
    # configparser costs 5.6 ms to import, 3% of a capture: a pip.conf that names no
    # source (a certificate, a timeout) is not parsed, as it could change nothing here.
    if not _PIP_SOURCE_KEYS.search(raw.decode("utf-8", "replace")):
        return
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(raw.decode("utf-8"), source=str(path))
    except (configparser.Error, UnicodeDecodeError):
        found.origin.append(f"pip config {path} (unreadable)")
        return
    used = False
    for section in ("global", "install", "download", "wheel"):
        if not parser.has_section(section):
            continue
        options = parser[section]
        if "index-url" in options:
            found.index, used = _split(options["index-url"])[:1], True
        if "extra-index-url" in options:
            found.extra += _split(options["extra-index-url"])
            used = True
        if "find-links" in options:
            found.find_links += _split(options["find-links"])
            used = True
        if options.get("no-index", "").strip().lower() in ("1", "true", "yes", "on"):
            found.no_index = used = True
    if used:
        found.origin.append(f"pip config {path}")


def _read_uv(path: Path, found: _Found) -> None:
    import tomllib  # only where a uv.toml or a [tool.uv] table exists

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        if path.exists():
            found.origin.append(f"uv config {path} (unreadable)")
        return
    if path.name == "pyproject.toml":
        tool = data.get("tool")
        data = tool.get("uv", {}) if isinstance(tool, dict) else {}
    if not isinstance(data, dict):
        return
    used = False
    for table in (data, _table(data, "pip")):
        if isinstance(table.get("index-url"), str):
            found.index, used = [table["index-url"]], True
        extra = table.get("extra-index-url")
        if isinstance(extra, list):
            found.extra += [u for u in extra if isinstance(u, str)]
            used = True
        if table.get("no-index") is True:
            found.no_index = used = True
        links = table.get("find-links")
        if isinstance(links, list):
            found.find_links += [u for u in links if isinstance(u, str)]
            used = True
    indexes = data.get("index")
    if isinstance(indexes, list):
        for index in indexes:
            if isinstance(index, dict) and isinstance(index.get("url"), str):
                if index.get("format") == "flat":
                    found.find_links.append(index["url"])
                elif index.get("default") is True:
                    found.index = [index["url"]]
                else:
                    found.extra.append(index["url"])
                used = True
    if used:
        found.origin.append(f"uv config {path}")


def _uv_index_value(value: str) -> list[str]:
    """``UV_INDEX`` entries are ``url`` or ``name=url``, space separated."""
    out = []
    for item in value.split():
        name, eq, url = item.partition("=")
        out.append(url if eq and "://" not in name else item)
    return out


def probe_sources(environ: Mapping[str, str] | None = None, *, cwd: Path | None = None,
                  etc: Path = Path("/etc")) -> Sources:
    """The indexes and find-links pip and uv were configured with (credentials stripped).

    Configuration files first (pip's, then uv's, each in its own load order),
    then the variables (``PIP_INDEX_URL``, ``PIP_EXTRA_INDEX_URL``,
    ``PIP_FIND_LINKS``, ``UV_INDEX_URL``, ``UV_DEFAULT_INDEX``, ``UV_INDEX``,
    ``UV_EXTRA_INDEX_URL``, ``UV_FIND_LINKS``), which override them as they
    do for the installers. With no index configured anywhere, both installers
    use PyPI, and the origin says so.
    """
    env = os.environ if environ is None else environ
    here = Path.cwd() if cwd is None else cwd
    found = _Found()
    for path in _pip_config_files(env, etc):
        if path.is_file():
            _read_pip(path, found)
    for path in _uv_config_files(env, etc, here):
        if path.is_file():
            _read_uv(path, found)
    single = {"PIP_INDEX_URL": "index", "UV_INDEX_URL": "index", "UV_DEFAULT_INDEX": "index"}
    if any(env.get(v, "").strip().lower() in ("1", "true", "yes", "on")
           for v in ("PIP_NO_INDEX", "UV_NO_INDEX")):
        found.no_index = True
        found.origin.append("PIP_NO_INDEX" if env.get("PIP_NO_INDEX") else "UV_NO_INDEX")
    for variable in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "UV_INDEX_URL",
                     "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS"):
        value = env.get(variable, "").strip()
        if not value:
            continue
        found.origin.append(variable)
        if variable in single:
            found.index = _split(value)[:1]
        elif variable == "UV_INDEX":
            found.extra += _uv_index_value(value)
        elif variable.endswith("FIND_LINKS"):
            found.find_links += _split(value)
        else:
            found.extra += _split(value)
    if found.no_index:
        indexes: list[str] = []
    else:
        indexes = _clean([*(found.index or [PYPI_SIMPLE]), *found.extra])
    said = ", ".join(found.origin) if found.origin else "nothing configured"
    if not found.index and not found.no_index:
        said += "; no index-url set, so pip and uv use PyPI"
    return Sources(indexes=indexes, find_links=_clean(found.find_links),
                   origin=said + "; options on an installer's command line leave no trace")
