"""Where a rebuild may fetch from, and which recorded values reach the installer: one check.

A manifest's environment record is data written by whoever made the run, and it ends up
in an installer's argv and in the URLs it fetches. So every recorded name, version,
wheel tag, URL and hash is validated here, before anything runs, and a hostile one is
refused with one sentence (:class:`HostileRecordError`, exit 2):

* a name that is not a PEP 508 name: one starting with ``-`` would be an option in uv's
  argv (``--index-url=…``), one with ``/`` or ``..`` is a path uv would install from;
* a version that is not PEP 440 (the spec's own regular expression, appendix B, since
  ``packaging`` is not a dependency of this tool);
* a URL with credentials (userinfo, or a token/signature query parameter: a manifest
  must never carry one, and using it would act as its author), with a scheme other
  than ``https``/``http``/``file``, or a ``file://`` URL outside the tree (a recorded
  path on this machine is a file the author chose: only the project's own tree may be
  named).

Where packages come from is a trust decision like running the command
(``manifest.trust``): an index, find-links folder or direct URL *recorded* in the
manifest is used only when the manifest is trusted (sealed here, signed by a trusted
identity, or ``--trust``: the same :class:`~manifest.trust.TrustDecision` verify uses);
otherwise it is listed in :attr:`SourcePlan.withheld` for the user to read. Sources the
user passes (``--find-links DIR``, ``--index-url URL``) are always used, and nothing
else: the machine's pip and uv configuration never is (``manifest.pyenv.rebuild``).

A recorded archive hash (PEP 610 ``archive_info``) is required of the file that is
installed (``--hash`` on its requirement line; uv refuses a file that does not match).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from manifest.errors import ManifestError
from manifest.trust import TrustDecision, escape_text

SELF_DISTRIBUTIONS = frozenset({"torch-manifest", "manifest"})
"""This tool: never rebuilt from a record (its version is not installable by name from a
checkout, and a re-run's launcher brings its own stdlib-only copy)."""

# PEP 508 names: ASCII letters and digits, with ``.``, ``_``, ``-`` inside only.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# PEP 440, appendix B (packaging.version.VERSION_PATTERN), anchored.
_VERSION = re.compile(
    r"""v?(?:(?:[0-9]+)!)?[0-9]+(?:\.[0-9]+)*
    (?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?[0-9]*)?
    (?:-[0-9]+|[-_.]?(?:post|rev|r)[-_.]?[0-9]*)?
    (?:[-_.]?dev[-_.]?[0-9]*)?
    (?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?""", re.VERBOSE | re.IGNORECASE)
_TAG = re.compile(r"[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{7,64}")
_NORMALISE = re.compile(r"[-_.]+")
_URL_SCHEMES = ("https", "http", "file")


class HostileRecordError(ManifestError):
    """A recorded name, version, URL or hash that must not reach the installer (exit 2)."""


def normalise(name: str) -> str:
    """PEP 503 normalised name (``Foo_Bar`` → ``foo-bar``)."""
    return _NORMALISE.sub("-", name).lower()


def check_name(name: str) -> str:
    """``name`` if it is a PEP 508 distribution name; else one sentence (HostileRecordError)."""
    shown = escape_text(name)
    if name.startswith("-"):
        raise HostileRecordError(f"refusing the recorded distribution name '{shown}': it would "
                                 "be read as an option by the installer.")
    if "/" in name or "\\" in name or name.startswith(".") or name == "":
        raise HostileRecordError(f"refusing the recorded distribution name '{shown}': it is a "
                                 "path, not a name.")
    if not _NAME.fullmatch(name):
        raise HostileRecordError(f"refusing the recorded distribution name '{shown}': not a "
                                 "valid distribution name (PEP 508).")
    return name


def check_version(name: str, version: str) -> str:
    """``version`` if it is a PEP 440 version; else one sentence."""
    if not _VERSION.fullmatch(version):
        raise HostileRecordError(
            f"refusing the recorded version '{escape_text(version)}' of {name}: not a valid "
            "version (PEP 440).")
    return version


def check_tags(name: str, tags: Iterable[str]) -> list[str]:
    """The wheel tags from ``WHEEL`` (``py3-none-any``), each three dotted parts."""
    out = []
    for tag in tags:
        if not _TAG.fullmatch(tag):
            raise HostileRecordError(f"refusing the recorded wheel tag '{escape_text(tag)}' of "
                                     f"{name}: not a wheel tag.")
        out.append(tag)
    return out


def check_url(url: str, *, what: str, tree: Path | None) -> str:
    """``url`` if it may be fetched: https/http/file, no credentials, a file:// inside ``tree``.

    ``tree`` is the project's tree (None: no ``file://`` URL is allowed at all).
    """
    from manifest.redact import is_secret_param, redact_url

    shown = escape_text(redact_url(url))
    if url.startswith("-") or any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise HostileRecordError(f"refusing {what} '{shown}': not a URL.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise HostileRecordError(f"refusing {what} '{shown}': not a URL.") from None
    if parts.scheme not in _URL_SCHEMES:
        raise HostileRecordError(f"refusing {what} '{shown}': only https, http and file URLs "
                                 "are fetched.")
    secret_query = any(is_secret_param(k) for k, _ in parse_qsl(parts.query, True))
    if parts.username is not None or parts.password is not None or secret_query:
        raise HostileRecordError(f"refusing {what} '{shown}': it carries credentials, which a "
                                 "manifest must never hold.")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise HostileRecordError(f"refusing {what} '{shown}': a file URL on another host.")
        if tree is None or not _inside(Path(unquote(parts.path)), tree):
            raise HostileRecordError(f"refusing {what} '{shown}': a file URL outside the "
                                     "project's tree.")
    elif not parts.hostname:
        raise HostileRecordError(f"refusing {what} '{shown}': no host.")
    return url


def _inside(path: Path, tree: Path) -> bool:
    try:
        real = Path(os.path.realpath(path))
        return real == Path(os.path.realpath(tree)) or real.is_relative_to(
            os.path.realpath(tree))
    except (OSError, ValueError):
        return False


# ------------------------------------------------------------------ the pins


def rebuild_set(distributions: Mapping[str, Any], imported: Iterable[str] | None
                ) -> list[str] | None:
    """The names a rebuild installs: what the run imported, plus torch and its CUDA libraries.

    This tool and its own dependencies that the run never imported (pydantic, blake3,
    rich …) are left out on purpose: they cannot change the run's bits, and the re-run's
    launcher needs none of them. None (everything recorded) when the run's imports are not
    known (a snapshot without a command).
    """
    from manifest.models import always_counts

    if imported is None:
        return None
    wanted = {normalise(n) for n in imported}
    return sorted(n for n in (normalise(k) for k in distributions)
                  if n in wanted or always_counts(n))


@dataclass(frozen=True)
class Pin:
    """One recorded distribution, validated: what the installer is asked for."""

    name: str
    """The recorded name, normalised (PEP 503)."""
    version: str
    tags: tuple[str, ...]
    files: str | None
    """The recorded content digest (``blake3:…``) the rebuild is proven against; None: not
    recorded, so the distribution cannot be proven."""
    url: str | None = None
    """A PEP 610 direct URL (an archive, a VCS checkout, a local directory), validated."""
    sha256: str | None = None
    """The archive's sha256 when the record knows it: required of the installed file."""
    kind: str = "index"
    """``index`` (a wheel by name from an index or find-links), ``archive`` (a wheel at a
    direct URL), ``sdist`` (built here from an sdist whose sha256 is recorded: rebuilt
    from the same file when a source serves it), ``built-here`` (an sdist with no recorded
    hash, an editable or local-path install, a VCS checkout: not rebuilt), or ``self``
    (this tool)."""
    vcs: Mapping[str, str] = field(default_factory=dict)
    """For a VCS record: ``vcs`` and ``commit_id``."""
    editable: bool = False
    withheld_url: str | None = None
    """A recorded ``file://`` archive outside the tree: never read, shown as not used."""
    why: str | None = None
    """For ``built-here`` and ``sdist``: how the record shows it was built here, said to
    the user before anything trains."""

    @property
    def sdist_name(self) -> str | None:
        """The recorded sdist's file name (``sdist`` pins)."""
        if self.kind != "sdist" or not self.url:
            return None
        return unquote(urlsplit(self.url).path).rsplit("/", 1)[-1] or None


def _plain(value: Any) -> Any:
    """A model (pydantic) or a mapping as plain JSON data."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_none=True)
    return value


_ARCHIVES = (".whl", ".tar.gz", ".zip", ".tar.bz2", ".tgz", ".tar")
_SDISTS = _ARCHIVES[1:]

_LOCAL_PLATFORM = re.compile(r"[^-]+-[^-]+-(?:linux|any_linux)_[a-z0-9_]+")
"""A wheel tag only a local build has: ``linux_x86_64`` (indexes serve manylinux and
musllinux wheels; PyPI refuses a plain ``linux`` one), what pip and uv tag a wheel they
built from an sdist on this machine."""


def built_locally(tags: Iterable[str]) -> str | None:
    """The recorded tag that says a distribution's wheel was built here, if one does."""
    return next((t for t in tags if _LOCAL_PLATFORM.fullmatch(t)), None)


def _direct(name: str, raw: Any, tree: Path | None) -> dict[str, Any]:
    """The PEP 610 fields of a record (``models.DirectUrl``), validated.

    A wheel at a URL is fetched (``archive``); an sdist whose sha256 is recorded is
    ``sdist``, which ``manifest.pyenv.rebuild`` builds from that same file only for a
    trusted manifest (building it runs its author's build backend; untrusted, it is
    ``built-here``); an sdist without a hash, a VCS checkout or a directory (editable or
    not) is ``built-here``, never built by a rebuild (the project's checkout is the
    caller's to install).
    """
    direct = _plain(raw)
    if not isinstance(direct, Mapping) or not isinstance(direct.get("url"), str):
        raise HostileRecordError(f"refusing the recorded direct URL of {name}: no URL.")
    url = direct["url"]
    out: dict[str, Any] = {"url": url, "editable": bool(direct.get("editable"))}
    archive_hash = direct.get("archive_hash")
    if archive_hash is not None:
        algo, _, value = str(archive_hash).partition("=")
        if algo != "sha256" or not _SHA256.fullmatch(value):
            raise HostileRecordError(f"refusing the recorded archive hash of {name}: not a "
                                     "sha256=<64 hex digits>.")
        out["sha256"] = value
    commit = direct.get("commit_id")
    if direct.get("vcs") is not None:
        if not (isinstance(commit, str) and _COMMIT.fullmatch(commit)):
            raise HostileRecordError(f"refusing the recorded VCS commit of {name}: not a "
                                     "commit id.")
        if not re.fullmatch(r"git|hg|bzr|svn", str(direct["vcs"])):
            raise HostileRecordError(f"refusing the recorded VCS of {name}: "
                                     f"'{escape_text(str(direct['vcs']))}' is none of git, hg, "
                                     "bzr, svn.")
        out["vcs"] = {"vcs": str(direct["vcs"]), "commit_id": commit}
        out["kind"] = "built-here"
        scheme = url.split("://", 1)[0]
        check_url(url.split("+", 1)[1] if "+" in scheme else url,
                  what=f"the recorded VCS URL of {name}", tree=tree)
        return out
    path = unquote(urlsplit(url).path)
    out["kind"] = "archive" if path.endswith(".whl") else "built-here"
    if url.startswith("file:") and not url.startswith("file:///"):
        raise HostileRecordError(f"refusing the recorded URL of {name} "
                                 f"'{escape_text(url)}': a file URL on another host.")
    if out["kind"] == "archive":
        try:
            check_url(url, what=f"the recorded archive URL of {name}", tree=tree)
        except HostileRecordError as exc:
            if not url.startswith("file:") or "credentials" in exc.message:
                raise
            # A wheel the author installed from a file on their machine: that path is never
            # read here. The same file (its recorded hash, when known) is looked for by name
            # in the sources instead, and the URL is shown as not used.
            out.update(kind="index", withheld=url, url=None)
    elif not url.startswith("file:"):  # an sdist or directory elsewhere: shown, not fetched
        check_url(url, what=f"the recorded URL of {name}", tree=None)
    if path.endswith(_SDISTS) and not out["editable"]:
        # the file is looked for by name in the sources, as a withheld wheel is: the
        # author's path or host is never read
        if "sha256" in out:
            out["kind"] = "sdist"
            out["why"] = ("built here from its sdist; rebuilt from the same file (sha256 "
                          "as recorded) when a source serves it")
        else:
            out["why"] = "built here from an sdist whose hash was not recorded: not rebuilt"
    return out


def pins_of(distributions: Mapping[str, Any], *, tree: Path | None,
            only: Iterable[str] | None = None) -> list[Pin]:
    """Every recorded distribution as a validated :class:`Pin`, sorted by name.

    ``distributions`` is ``env.distributions`` (name → record with ``version``, ``tags``,
    ``direct_url``, ``files``). ``only`` (normalised names) keeps a subset: the
    distributions the run imported plus torch and its CUDA libraries. A direct URL's
    ``file://`` path is validated against ``tree``. Raises :class:`HostileRecordError`
    on the first value that must not reach the installer, before anything runs.
    """
    keep = None if only is None else {normalise(n) for n in only}
    pins = []
    for raw_name, record in distributions.items():
        name = normalise(check_name(raw_name))
        if keep is not None and name not in keep:
            continue
        data = _plain(record)
        version = data.get("version")
        if not isinstance(version, str):
            raise HostileRecordError(f"refusing the record of {name}: it has no version.")
        check_version(name, version)
        tags = tuple(check_tags(name, data.get("tags") or ()))
        files = data.get("files")
        if files is not None and not (isinstance(files, str)
                                      and re.fullmatch(r"blake3:[0-9a-f]{64}", files)):
            raise HostileRecordError(f"refusing the recorded content digest of {name}.")
        if name in SELF_DISTRIBUTIONS:
            pins.append(Pin(name, version, tags, files, kind="self"))
            continue
        direct = data.get("direct_url")
        if direct is None:
            local = built_locally(tags)
            if local is not None:  # an sdist an index served, built at install: no hash
                pins.append(Pin(name, version, tags, files, kind="built-here", why=(
                    f"built here from an sdist (wheel tag {local}): no index serves that "
                    "wheel, and no hash of the sdist was recorded to rebuild it from")))
            else:
                pins.append(Pin(name, version, tags, files))
            continue
        d = _direct(name, direct, tree)
        pins.append(Pin(name, version, tags, files, url=d["url"], sha256=d.get("sha256"),
                        kind=d["kind"], vcs=d.get("vcs", {}), editable=d["editable"],
                        withheld_url=d.get("withheld"), why=d.get("why")))
    return sorted(pins, key=lambda p: p.name)


# ------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class SourcePlan:
    """Where a rebuild fetches from: exactly these, in this order, and nothing else."""

    find_links: tuple[str, ...]
    """Folders (or URLs) of wheels: the user's, then the recorded ones when trusted."""
    index_urls: tuple[str, ...]
    """Simple indexes (PEP 503), first first: the user's, then the recorded ones if trusted."""
    withheld: tuple[str, ...]
    """Recorded indexes and find-links shown but not used: the manifest is not trusted
    (``--trust``), or they name the author's machine (a folder outside the tree)."""
    trust: str
    """Why recorded sources are (or are not) used: the trust decision's reason."""
    direct_urls_allowed: bool
    """Whether a recorded direct URL (an archive) may be fetched: only when trusted."""

    def lines(self) -> list[str]:
        """The plan as text lines for the user, every URL redacted and escaped."""
        from manifest.redact import redact_url

        out = [f"find-links: {escape_text(redact_url(f))}" for f in self.find_links]
        out += [f"index: {escape_text(redact_url(i))}" for i in self.index_urls]
        if not self.find_links and not self.index_urls:
            out.append("no source: pass --find-links DIR or --index-url URL")
        out += [f"recorded, not used: {escape_text(redact_url(w))}"
                for w in self.withheld]
        return out


def plan_sources(recorded: Any, *, find_links: Iterable[str | Path] = (),
                 index_urls: Iterable[str] = (), trust: TrustDecision,
                 tree: Path | None, pins: Iterable[Pin] = ()) -> SourcePlan:
    """Decide the sources: the user's always, the recorded ones (``env.sources``) if trusted.

    ``recorded`` is the manifest's ``env.sources`` (``indexes``, ``find_links``) or None.
    The user's folders must exist; the user's URLs are checked like recorded ones except
    that a ``file://`` URL may name any folder (the user typed it). Recorded values are
    validated even when withheld, so a hostile record is refused, not merely unused.
    A pin's recorded ``file://`` archive outside the tree is listed as withheld too.
    """
    links: list[str] = []
    for folder in find_links:
        path = Path(folder)
        if str(folder).startswith("-") or not path.is_dir():
            raise HostileRecordError(f"--find-links {escape_text(str(folder))}: not a folder.")
        links.append(str(path.resolve()))
    indexes = [check_url(u, what="--index-url", tree=Path("/")) for u in index_urls]
    data = _plain(recorded) if recorded is not None else {}
    # The author's configuration names folders and file:// indexes of the author's machine
    # (this one's pip.conf names /opt/wheels): those are facts about the run, not inputs a
    # rebuild here may read, so they are shown and never used; a recorded source that
    # carries credentials is refused outright.
    rec_indexes: list[str] = []
    rec_links: list[str] = []
    unusable: list[str] = []
    for raw, bucket, what in ([(u, rec_indexes, "the recorded index")
                               for u in data.get("indexes") or []]
                              + [(u, rec_links, "the recorded find-links")
                                 for u in data.get("find_links") or []]):
        text = str(raw)
        if "://" not in text:
            text = Path(text).resolve().as_uri() if os.path.isabs(text) else text
        try:
            bucket.append(check_url(text, what=what, tree=tree))
        except HostileRecordError as exc:
            if "credentials" in exc.message or "not a URL" in exc.message:
                raise
            unusable.append(text)
    if trust.allowed:
        indexes += [u for u in rec_indexes if u not in indexes]
        links += [f for f in rec_links if f not in links]
        withheld = [u for u in unusable if u not in indexes and u not in links
                    and u.removeprefix("file://") not in links]
    else:
        withheld = [u for u in rec_indexes + rec_links + unusable
                    if u not in indexes and u not in links
                    and u.removeprefix("file://") not in links]
    withheld += [p.withheld_url for p in pins if p.withheld_url]
    return SourcePlan(tuple(links), tuple(indexes), tuple(withheld), trust.reason,
                      trust.allowed)
