"""Data in buckets and on the Hub, pinned from metadata and re-checked before a re-run.

Pinning (:func:`pin_dataset`) lists the objects under a prefix and writes
one line per object (key, size, version, provider checksum and its kind,
ETag) to a ``manifest-remote/v1`` blob as the listing streams in; the
dataset's ``root`` is the keyed BLAKE3 of those lines (``pins``), so any
change to any object changes the ``run_id``. No object body is read unless
``mode`` is ``deep``, which streams every object and records the same BLAKE3
tree root a local copy gives (``deep``). Each pin carries its strength
(``pins``): content digest, version pin, or change detector only.

:func:`recheck` re-lists a recorded dataset and names each object that was
added, removed or changed, and whether a pinned version is still readable or
gone, before a re-run spends any compute.

Providers, each an optional extra imported only here, lazily: ``s3``
(boto3), ``gcs`` (google-cloud-storage), ``hf`` (huggingface_hub), ``delta``
(deltalake). Modules: ``url`` (what a URL names, which endpoint) ← ``pins``
(the format, the root, the strength) ← ``source`` (the provider interface) ←
``s3``/``gcs``/``hf``/``delta`` ← ``deep`` (bodies) ← this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from manifest.data.listing import path_bytes
from manifest.data.remote.pins import ObjectPin, PinSink, describe_change, parse_pins
from manifest.data.remote.url import endpoint_for, is_remote, parse_url, strip_userinfo
from manifest.errors import DataError

if TYPE_CHECKING:
    from manifest.data.remote.source import ProgressSink, Source
    from manifest.models import Dataset
    from manifest.store import BlobStore

__all__ = ["Recheck", "is_remote", "pin_dataset", "recheck", "recheck_pins"]

MODES = ("listing", "checksums", "deep")


def pin_dataset(name: str, url_text: str, *, store: BlobStore, mode: str = "listing",
                progress: ProgressSink | None = None) -> Dataset:
    """Pin the remote dataset at ``url_text``; its pins go to a blob in ``store``.

    ``progress``: where the objects and bytes read so far are shown (the CLI's line);
    the listing's only where the line is ``live`` (a log of listing counts is noise), the
    deep read's always (with its total, each line says how far it is).

    Raises :class:`DataError` (one sentence, exit 2) when the data cannot be
    listed or read, or the prefix holds no object.
    """
    from manifest.data.remote.registry import open_source
    from manifest.data.remote.source import Progress
    from manifest.models import Dataset, RemotePin

    if mode not in MODES:
        raise DataError(f"unknown remote pinning mode {mode!r}.")
    url = parse_url(url_text)
    label = url.text()
    endpoint = endpoint_for(url.provider)
    source = open_source(url, endpoint)
    listing_progress = Progress(f"listing {label}",
                                show=progress if progress is not None and progress.live else None)
    writer = store.writer()
    sink = PinSink(writer, label)
    kept: list[ObjectPin] | None = [] if mode == "deep" else None

    def add(pin: ObjectPin) -> None:
        sink.add(pin)
        if kept is not None:
            kept.append(pin)
        listing_progress(1, pin.size)

    try:
        revision = source.list_pins(add, checksums=mode == "checksums")
        if not sink.objects:
            raise DataError(f"no objects under {label}.",
                            hint="Check the bucket, the prefix (a folder: keys below "
                                 "PREFIX/) and the revision.")
        pins_blob = writer.commit()
    except BaseException:
        writer.discard()
        raise
    finally:
        listing_progress.close()
    root, listing, strength = sink.root_text(), pins_blob, sink.strength()
    if kept is not None:
        from manifest.data.remote.deep import deep_listing, deep_root

        deep_progress = Progress(f"reading {label}", show=progress, total=len(kept))
        try:
            tree = deep_listing(source, kept, label=label, progress=deep_progress)
        finally:
            deep_progress.close()
        root, listing, strength = deep_root(tree), store.put(tree), "content-digest"
    remote = RemotePin(
        provider=url.provider,  # type: ignore[arg-type]
        endpoint=strip_userinfo(endpoint) if endpoint else None, revision=revision,
        mode=mode,  # type: ignore[arg-type]
        strength=strength,  # type: ignore[arg-type]
        pins=pins_blob, checksums=dict(sorted(sink.kinds.items())), versioned=sink.versioned)
    return Dataset(name=name, path=label, root=root, files=sink.objects,
                   bytes=sink.total_bytes, listing=listing, remote=remote)


class Recheck(NamedTuple):
    """What re-listing a remote dataset found: the objects that changed, or why it
    could not be checked at all (then nothing is known about its objects)."""

    changed: list[str]
    unchecked: str | None = None


def recheck(dataset: Dataset, store: BlobStore) -> list[str]:
    """Re-list a recorded remote dataset: one line per object that changed (empty: same).

    Each line names the object and what happened: ``changed: KEY (version a → b;
    the pinned version is still readable)``, ``removed: KEY (pinned version
    gone)``, ``added: KEY``, ``gone: KEY`` (a Delta file vacuumed). Lines on the
    revision come first: a Hub branch that points at another commit now, a Delta
    table whose latest version moved on. Problems that stop the check (no access, no
    library, a different endpoint) are one line too; nothing is raised for them.
    ``recheck_pins`` keeps the two apart.
    """
    found = recheck_pins(dataset, store)
    return [found.unchecked] if found.unchecked is not None else found.changed


def recheck_pins(dataset: Dataset, store: BlobStore) -> Recheck:
    """``recheck``, with a problem that stopped the check kept apart from a change:
    verify says "not checked" for the one and "changed" for the other."""
    pin = dataset.remote
    if pin is None:
        return Recheck([])
    recorded_blob = store.get(pin.pins)
    if recorded_blob is None:
        return Recheck([], f"the pins of {dataset.path} are not in the store "
                       f"({pin.pins[:19]}…): cannot name what changed.")
    try:
        recorded = parse_pins(recorded_blob)
        return _compare(dataset, recorded, store)
    except DataError as exc:
        return Recheck([], exc.diagnostics())


def _compare(dataset: Dataset, recorded: dict[str, ObjectPin], store: BlobStore) -> Recheck:
    from manifest.data.remote.registry import open_source

    pin = dataset.remote
    assert pin is not None
    url = parse_url(dataset.path)
    endpoint = endpoint_for(url.provider)
    today_endpoint = strip_userinfo(endpoint) if endpoint else None
    if today_endpoint != pin.endpoint:
        # Never follow a manifest's endpoint: it would receive this user's credentials.
        return Recheck([], f"{dataset.path} was pinned at endpoint "
                       f"{pin.endpoint or 'the default'}, today's is "
                       f"{today_endpoint or 'the default'}: set the provider's endpoint "
                       "variable to recheck it there.")
    source = open_source(url, endpoint, revision=pin.revision)
    changes: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(today: ObjectPin) -> None:
        seen.add(today.key)
        before = recorded.get(today.key)
        if before is None:
            changes.append((today.key, f"added: {today.key} ({today.size} bytes)"))
        elif _differs(before, today):
            changes.append((today.key, f"changed: {today.key} ({describe_change(before, today)}"
                                       f"{_still_there(source, before)})"))

    source.list_pins(add, checksums=pin.mode == "checksums")
    for key in recorded.keys() - seen:
        changes.append((key, f"removed: {key}{_still_there(source, recorded[key], True)}"))
    objects = [line for _, line in sorted(changes, key=lambda item: path_bytes(item[0]))]
    return Recheck(source.drift() + objects)


def _differs(before: ObjectPin, today: ObjectPin) -> bool:
    if before.version and today.version:
        return before.version != today.version or before.size != today.size
    return before != today


def _still_there(source: Source, before: ObjectPin, removed: bool = False) -> str:
    if not before.version:
        return ""
    readable = source.version_readable(before)
    prefix = " (" if removed else "; "
    suffix = ")" if removed else ""
    if readable:
        return f"{prefix}the pinned version is still readable{suffix}"
    return f"{prefix}the pinned version is gone{suffix}"
