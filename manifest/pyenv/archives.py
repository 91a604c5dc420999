"""Which source serves each recorded wheel: found before anything is installed.

A recorded distribution is a name, a version and the wheel tags of the file it came from
(``WHEEL``'s ``Tag:`` lines). A source serves it when it lists a wheel of that name and
version whose tags share one with the record (``py2.py3-none-any`` expands to two). The
sources are searched in the plan's order (find-links folders, then simple indexes) and
the first match wins, as an installer's would; a distribution that no source serves is
``vanished``, and it is named before any environment is built.

Each found file is handed to uv as a direct reference with its sha256 (``name @ URL
--hash=sha256:…``, ``--no-index``): uv installs exactly these files, resolves nothing and
refuses one whose bytes changed since. The hash comes from the index's link
(``#sha256=``, PEP 503), from the record (PEP 610), or from reading a find-links file
(~0.6 s for a 1 GB wheel). A recorded archive hash must match the file found: another
file of the same name and version is not the run's.

Indexes are read as PEP 503 HTML (``Accept: text/html``) over http(s) or ``file://``
(a folder's ``index.html``); a page is capped at 16 MiB and a request at 60 s.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from manifest.pyenv.sources import Pin, SourcePlan, normalise

PAGE_LIMIT = 16 << 20
TIMEOUT_S = 60.0
_WHEEL = re.compile(r"(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?"
                    r"-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl")


@dataclass(frozen=True)
class Archive:
    """One wheel a source serves for a pin."""

    filename: str
    url: str
    """``file://`` for a find-links file, else the index's link (fragment dropped)."""
    sha256: str | None
    index: str | None = None
    """The simple index that served it; None for a find-links folder or a direct URL."""


def wheel_tags(filename: str) -> tuple[str, str, frozenset[str]] | None:
    """``(normalised name, version, expanded tags)`` of a wheel file name, or None."""
    m = _WHEEL.fullmatch(filename)
    if m is None:
        return None
    tags = frozenset(f"{py}-{abi}-{plat}" for py in m["py"].split(".")
                     for abi in m["abi"].split(".") for plat in m["plat"].split("."))
    return normalise(m["name"]), m["version"].replace("_", "-").lower(), tags


def serves(filename: str, pin: Pin) -> bool:
    """Whether a wheel of this name is the pin's: name, version, and one tag in common."""
    parsed = wheel_tags(filename)
    if parsed is None:
        return False
    name, version, tags = parsed
    if name != pin.name or version != pin.version.replace("_", "-").lower():
        return False
    return not pin.tags or not tags.isdisjoint(pin.tags)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            for key, value in attrs:
                if key == "href" and value:
                    self.hrefs.append(value)


def _read_page(url: str) -> str | None:
    """A simple index's project page, or None when the index has no such project."""
    import urllib.error
    import urllib.request

    parts = urlsplit(url)
    if parts.scheme == "file":
        path = Path(unquote(parts.path))
        if path.is_dir():
            path = path / "index.html"
        try:
            with path.open("rb") as fh:
                return fh.read(PAGE_LIMIT).decode("utf-8", "replace")
        except OSError:
            return None
    request = urllib.request.Request(url, headers={"Accept": "text/html"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
            data: bytes = response.read(PAGE_LIMIT)
            return data.decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _index_links(index: str, name: str) -> Iterator[tuple[str, str, str]]:
    """``(file name, URL without fragment, fragment)`` of each link on an index's simple
    page for ``name``; a link that could be more than one requirement line (white space,
    a control character) or is not http(s) or file is never served."""
    page_url = index.rstrip("/") + f"/{name}/"
    page = _read_page(page_url)
    if page is None:
        return
    links = _Links()
    links.feed(page)
    for href in links.hrefs:
        url = urljoin(page_url, href)
        if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url) or \
                urlsplit(url).scheme not in ("https", "http", "file"):
            continue
        base, _, fragment = url.partition("#")
        yield unquote(urlsplit(base).path.rsplit("/", 1)[-1]), base, fragment


def _index_archives(index: str, pin: Pin) -> Archive | None:
    for filename, base, fragment in _index_links(index, pin.name):
        if not serves(filename, pin):
            continue
        algo, _, value = fragment.partition("=")
        sha = value if algo == "sha256" and re.fullmatch(r"[0-9a-f]{64}", value) else None
        return Archive(filename, base, sha)
    return None


def _folder_archive(folder: str, pin: Pin) -> Archive | None:
    path = Path(unquote(urlsplit(folder).path)) if folder.startswith("file:") else Path(folder)
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    for filename in names:
        if serves(filename, pin):
            found = path / filename
            return Archive(filename, found.resolve().as_uri(), None)
    return None


def _sdist(pin: Pin, plan: SourcePlan) -> Archive | None:
    """The recorded sdist, by its file name, in a find-links folder or on an index page,
    with the recorded sha256 (read from the folder's file; an index's ``#sha256=`` must
    agree when given, and uv checks the bytes): another file of that name is not it."""
    wanted = pin.sdist_name
    if wanted is None or pin.sha256 is None:
        return None
    for folder in plan.find_links:
        path = (Path(unquote(urlsplit(folder).path)) if folder.startswith("file:")
                else Path(folder)) / wanted
        if path.is_file() and file_sha256(path) == pin.sha256:
            return Archive(wanted, path.resolve().as_uri(), pin.sha256)
    for index in plan.index_urls:
        for filename, base, fragment in _index_links(index, pin.name):
            if filename != wanted:
                continue
            algo, _, value = fragment.partition("=")
            if algo == "sha256" and value != pin.sha256:
                continue
            return Archive(wanted, base, pin.sha256, index)
    return None


def locate(pin: Pin, plan: SourcePlan, *, hash_files: bool = True) -> Archive | None:
    """The first wheel a source of ``plan`` serves for ``pin``, or None (vanished).

    A recorded direct archive URL is the source itself when the plan allows recorded URLs
    (a trusted manifest); otherwise it is searched for by name like any pin. With
    ``hash_files`` a find-links file is read for its sha256 (what uv is told to require).
    A found file whose hash is not the recorded archive hash does not serve the pin.
    """
    if pin.kind == "sdist":
        return _sdist(pin, plan)
    if pin.kind == "archive" and pin.url and plan.direct_urls_allowed:
        return Archive(unquote(urlsplit(pin.url).path.rsplit("/", 1)[-1]), pin.url,
                       pin.sha256)
    for folder in plan.find_links:
        found = _folder_archive(folder, pin)
        if found is None:
            continue
        sha = pin.sha256
        if hash_files or sha is not None:
            actual = file_sha256(Path(unquote(urlsplit(found.url).path)))
            if sha is not None and actual != sha:
                continue
            sha = actual
        return Archive(found.filename, found.url, sha)
    for index in plan.index_urls:
        found = _index_archives(index, pin)
        if found is None:
            continue
        if pin.sha256 is not None and found.sha256 not in (None, pin.sha256):
            continue
        return Archive(found.filename, found.url, found.sha256 or pin.sha256, index)
    return None
