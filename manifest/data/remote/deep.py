"""``--deep``: read every pinned object and compute the root a local copy would give.

The listing is ``manifest-tree/v1`` (``manifest.data.listing``) exactly as
``manifest hash DIR`` writes it for a folder holding the objects under their
keys: a ``d`` line for every folder a key implies (and for a ``key/`` folder
marker), an ``f`` line with size and BLAKE3 for every object, sorted by the
raw bytes of the path. So ``manifest hash mirror/`` equals the bucket's deep
root exactly when the mirror holds the same names and bytes.

Bodies are read as a stream, :data:`~manifest.data.remote.source.CHUNK` at a
time, by :data:`WORKERS` threads with at most ``2 × WORKERS`` objects in
flight: memory is bounded by those, not by object sizes. Each object is read
at its pinned version (or under ``If-Match`` its listed ETag), so the bytes
hashed are the bytes pinned, and a size that differs from the listing is
refused. The lines themselves (~100 bytes an object) are held and sorted,
since folder lines interleave with keys (``a`` < ``a-b`` < ``a/x``).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterable

import blake3

from manifest.data.listing import LISTING_HEADER, file_line, path_bytes, path_text, tree_root
from manifest.data.remote.pins import ObjectPin
from manifest.data.remote.source import Progress, Source
from manifest.errors import DataError

WORKERS = 8


def _hash_object(source: Source, pin: ObjectPin) -> tuple[ObjectPin, bytes, int]:
    hasher = blake3.blake3()
    size = 0
    for chunk in source.read(pin):
        hasher.update(chunk)
        size += len(chunk)
    return pin, hasher.digest(), size


def deep_listing(source: Source, pins: Iterable[ObjectPin], *, label: str,
                 progress: Progress) -> bytes:
    """The ``manifest-tree/v1`` listing of the objects' bytes (DataError if unmirrorable)."""
    lines: list[tuple[bytes, str]] = []
    folders: set[bytes] = set()
    files: set[bytes] = set()

    def note(rel: bytes, is_folder: bool) -> None:
        parts = rel.split(b"/")
        if any(p in (b"", b".", b"..") for p in parts):
            raise DataError(f"object {path_text(rel)} of {label} has an empty, '.' or '..' "
                            "path component: no local copy can hold it, so --deep cannot "
                            "give it a tree root.")
        for depth in range(1, len(parts) + (1 if is_folder else 0)):
            folders.add(b"/".join(parts[:depth]))
        if not is_folder:
            files.add(rel)

    def take(done: concurrent.futures.Future[tuple[ObjectPin, bytes, int]]) -> None:
        pin, digest, size = done.result()
        if size != pin.size:
            raise DataError(f"object {pin.key} of {label} gave {size} bytes, "
                            f"{pin.size} listed.")
        lines.append((path_bytes(pin.key), file_line(size, digest, path_bytes(pin.key))))
        progress(1, size)

    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        pending: set[concurrent.futures.Future[tuple[ObjectPin, bytes, int]]] = set()
        for pin in pins:
            rel = path_bytes(pin.key)
            if rel.endswith(b"/"):
                if pin.size:
                    raise DataError(f"object {pin.key} of {label} ends in '/' and holds "
                                    "bytes: no local copy can hold it.")
                note(rel.rstrip(b"/"), True)
                continue
            note(rel, False)
            pending.add(pool.submit(_hash_object, source, pin))
            if len(pending) >= 2 * WORKERS:
                done, pending = concurrent.futures.wait(
                    pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    take(future)
        for future in concurrent.futures.as_completed(pending):
            take(future)
    clash = sorted(folders & files)
    if clash:
        raise DataError(f"{path_text(clash[0])} of {label} is both an object and a folder "
                        "of other objects: no local copy can hold both.")
    lines.extend((rel, f"d\t{path_text(rel)}\n") for rel in folders)
    lines.sort(key=lambda item: item[0])
    return (LISTING_HEADER + "\n" + "".join(line for _, line in lines)).encode("utf-8")


def deep_root(listing: bytes) -> str:
    return tree_root(listing)
