"""The data section of a manifest, ``manifest hash``, and naming what changed.

Glue between the verbs and :func:`manifest.data.digest.digest_path`:
``[NAME=]PATH`` specs, how a dataset's path is recorded (relative to the
repository, so a manifest is the same on every clone), where the digest
cache lives, and the listing blobs that let ``verify`` name the files that
changed instead of only saying that a root differs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from manifest.data.cache import DigestCache
from manifest.data.digest import digest_path
from manifest.data.listing import diff_listings, parse_listing, path_text
from manifest.errors import DataError

if TYPE_CHECKING:
    from manifest.data.remote.source import ProgressSink
    from manifest.models import Dataset
    from manifest.store import BlobStore


def compare_listing(recorded_listing: bytes, path: Path, *, store: BlobStore | None = None,
                    no_cache: bool = False, quiet: bool = True) -> list[str]:
    """Name what differs between a recorded listing and the tree at ``path`` today.

    An empty list means the dataset is unchanged. Uses the store's cache
    when ``store`` is given. Raises :class:`DataError` if ``path`` cannot be
    digested today (missing, unreadable) or the listing is malformed.
    """
    parse_listing(recorded_listing)
    cache = DigestCache.in_store(store.root) if store is not None else None
    label = path_text(os.fsencode(path))
    skip = [store.root] if store is not None else []
    today = digest_path(path, cache=cache, no_cache=no_cache, quiet=quiet, label=label,
                        skip=skip)
    return diff_listings(recorded_listing, today.listing, label=label)


# ----------------------------------------------------------------- datasets


def parse_data_spec(spec: str) -> tuple[str, Path]:
    """``NAME=PATH`` or ``PATH`` -> (name, path).

    ``NAME=`` is recognised when the text before the first ``=`` is not empty
    and has no ``/``; write ``./a=b`` for a path that contains ``=``. Without
    a name, the name is the path's last component (of the absolute path for
    ``.`` or ``..``).
    """
    name, sep, rest = spec.partition("=")
    if sep and name and "/" not in name:
        if not rest:
            raise DataError(f"dataset {spec!r} names no path; write NAME=PATH.")
        return path_text(os.fsencode(name)), Path(rest)
    if not spec:
        raise DataError("an empty dataset path was given.")
    path = Path(spec)
    base = path.name or Path(os.path.abspath(path)).name or "root"
    return path_text(os.fsencode(base)), path


def recorded_path(path: Path, repo_root: Path | None) -> str:
    """How a dataset path is written in the manifest.

    Inside ``repo_root``: relative to it, with ``/`` separators ("." for the
    root itself), so the manifest is the same on every clone. Elsewhere: the
    absolute path (symlinks not resolved). Both in the path text encoding.
    """
    absolute = os.path.abspath(path)
    if repo_root is not None:
        parent, leaf = os.path.split(absolute)
        for root, candidate in (
            (os.path.abspath(repo_root), absolute),
            (os.path.realpath(repo_root), os.path.join(os.path.realpath(parent), leaf)),
        ):
            rel = os.path.relpath(candidate, root)
            if rel != ".." and not rel.startswith("../"):
                return path_text(os.fsencode(Path(rel).as_posix()))
    return path_text(os.fsencode(absolute))


def _remote_spec(spec: str) -> tuple[str, str] | None:
    """``[NAME=]s3://…``, ``gs://…``, ``hf://…`` or ``delta://…`` -> (name, URL); None for a
    local path."""
    import re

    from manifest.data.remote.url import is_remote

    name, sep, rest = spec.partition("=")
    if sep and name and "/" not in name and is_remote(rest):
        return path_text(os.fsencode(name)), rest
    typed = rest if sep and name and "/" not in name else spec
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", typed) and not is_remote(typed):
        from manifest.redact import redact_url

        scheme = typed.split("://", 1)[0]
        raise DataError(f"--data {redact_url(typed)}: {scheme}:// URLs are not read as data.",
                        hint="Give a local path as a path, or an s3://, gs://, hf:// or "
                             "delta:/// URL.")
    if not is_remote(spec):
        return None
    from manifest.data.remote.url import parse_url

    url = parse_url(spec)
    base = url.prefix.rstrip("/").rsplit("/", 1)[-1] or url.bucket.rsplit("/", 1)[-1]
    return path_text(os.fsencode(base)), spec


def digest_datasets(specs: list[str], *, repo_root: Path | None, store: BlobStore,
                    no_cache: bool, quiet: bool, base: Path | None = None,
                    remote_mode: str = "listing",
                    remote_progress: ProgressSink | None = None) -> list[Dataset]:
    """Digest each ``[NAME=]PATH``; store each listing blob; return the data section.

    Relative paths are taken from ``base`` (default: the working directory);
    pass the pyproject.toml folder for paths from ``[tool.manifest] data``.
    ``s3://``, ``gs://``, ``hf://`` and ``delta://`` URLs are pinned by
    :mod:`manifest.data.remote` in ``remote_mode`` (``listing``, ``checksums``
    or ``deep``), their progress shown on ``remote_progress``.
    """
    from manifest.models import Dataset

    store.ensure()
    cache = DigestCache.in_store(store.root)
    datasets: list[Dataset] = []
    names: set[str] = set()
    for spec in specs:
        remote = _remote_spec(spec)
        if remote is not None:
            if remote[0] in names:
                raise DataError(f"two datasets are named {remote[0]!r}.",
                                hint="Name them apart with NAME=URL.")
            names.add(remote[0])
            from manifest.data.remote import pin_dataset

            datasets.append(pin_dataset(remote[0], remote[1], store=store, mode=remote_mode,
                                        progress=remote_progress))
            continue
        name, path = parse_data_spec(spec)
        if name in names:
            raise DataError(f"two datasets are named {name!r}.",
                            hint="Name them apart with NAME=PATH.")
        names.add(name)
        before, sep, after = spec.partition("=")
        typed = after if sep and before and "/" not in before else spec  # as parsed above
        if base is not None and not path.is_absolute():
            path = base / path
            typed = os.path.join(str(base), typed)
        label = path_text(os.fsencode(typed))  # a sentence shows the path as it was typed
        found = digest_path(path, cache=cache, no_cache=no_cache, quiet=quiet, label=label,
                            skip=[store.root], store=store)
        datasets.append(Dataset(name=name, path=recorded_path(path, repo_root), root=found.root,
                                files=found.files, bytes=found.total_bytes,
                                listing=found.blob))
    return datasets


# ---------------------------------------------------------------------- CLI


def find_repo_root(start: Path) -> Path | None:
    """The nearest folder at or above ``start`` holding ``.git`` (no git process)."""
    start = Path(os.path.abspath(start))
    for folder in (start, *start.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def _cli_store_root(store_dir: str | None, cwd: Path) -> Path | None:
    if store_dir:
        return Path(os.path.abspath(store_dir))
    from manifest.config import load_config
    from manifest.store import STORE_DIRNAME

    repo = find_repo_root(cwd)
    table, origin = load_config(cwd)
    configured = table.get("store")
    if isinstance(configured, str) and configured:
        base = repo or (origin.parent if origin else cwd)
        return Path(os.path.abspath(base / configured))
    return repo / STORE_DIRNAME if repo is not None else None


def hash_from_cli(path: Path, *, no_cache: bool, store_dir: str | None, quiet: bool,
                  as_json: bool) -> str:
    """``manifest hash PATH``: the root alone, or with ``--json`` the dataset entry.

    The cache lives in ``--store``, else the configured store, else the
    enclosing git repository's ``.manifest/``; outside a repository without
    ``--store`` nothing is cached (nothing is written next to user files).
    """
    from manifest.errors import OutputError
    from manifest.store import BlobStore

    cwd = Path.cwd()
    store_root = _cli_store_root(store_dir, cwd)
    cache = None
    if store_root is not None:
        try:
            # Creates the store with its self-ignoring .gitignore, so the cache
            # never shows up as an untracked change of the repository.
            BlobStore(store_root).ensure()
            cache = DigestCache.in_store(store_root)
        except OutputError:
            store_root = None  # an unwritable store only costs the cache
    label = path_text(os.fsencode(path))
    # The listing is only wanted for --json, where it goes to the store.
    listing_store = BlobStore(store_root) if as_json and store_root is not None else None
    found = digest_path(path, cache=cache, no_cache=no_cache, quiet=quiet, label=label,
                        skip=[store_root] if store_root is not None else [],
                        store=listing_store, keep=False)
    if not as_json:
        return found.root
    from manifest.canonical import canonical_bytes
    from manifest.models import Dataset

    name, _ = parse_data_spec(str(path))
    listing = found.blob
    entry = Dataset(name=name, path=recorded_path(path, find_repo_root(cwd)), root=found.root,
                    files=found.files, bytes=found.total_bytes, listing=listing)
    return canonical_bytes(entry.model_dump(mode="json")).decode("utf-8")
