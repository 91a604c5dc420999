r"""The pins of a remote dataset: one line per object, and the root over them.

Format ``manifest-remote/v1``: UTF-8 text, the header line and then one
line per object, fields separated by TAB, each line ended by LF::

    o <size> <version> <checksum kind> <checksum hex> <etag> <key>

* ``<key>`` is relative to the dataset's prefix, in the path text encoding of
  ``manifest.data.listing`` (reversible, valid UTF-8).
* ``<version>`` is the S3 version id, the GCS generation, or the Hub commit
  the file was listed at; ``-`` when the bucket keeps no versions.
* ``<checksum kind>`` names what the provider computed (``crc64nvme``,
  ``crc32c``, ``md5``, ``sha256``, ``git-sha1`` …, or ``none``) and the hex is
  its value (``-`` when none). Kinds ending ``-composite`` and ``etag*`` are
  not digests of the bytes (a multipart ETag is the MD5 of the parts' MD5s;
  a COMPOSITE checksum is a checksum of the part checksums).
* ``<etag>`` is the provider's ETag without quotes (``-`` when none).
* Lines are sorted by the raw bytes of the key. S3 and GCS list in that
  order (UTF-8 binary), so a listing of any size streams from the provider to
  the blob store through the root's hasher with flat memory; a key that
  arrives out of order is refused rather than silently re-sorted.

The root is the BLAKE3 derive-key hash, context ``"manifest dataset-remote
v1"``, of the listing, so it can never equal a local tree's root (another
context), and any change to any object's key, size, version or checksum
changes it, hence the ``run_id``. Recompute it with
``b3sum --derive-key "manifest dataset-remote v1" pins.txt``.

Strength (``RemotePin.strength``) is that of the weakest object: a
*content digest* when the provider's checksum is a function of the object's
full bytes; else a *version pin* when the object is pinned to an immutable
version; else a *change detector* (size and ETag: they change when the object
is rewritten, and prove nothing about which bytes it holds).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, NamedTuple

import blake3

from manifest.data.listing import path_bytes, path_text
from manifest.errors import DataError

if TYPE_CHECKING:
    from manifest.store import BlobWriter

PINS_HEADER = "manifest-remote/v1"
PINS_CONTEXT = "manifest dataset-remote v1"

CONTENT_KINDS = frozenset({"crc64nvme", "crc32c", "crc32", "sha1", "sha256", "md5", "git-sha1"})
"""Checksums of an object's full bytes (CRCs detect accidental change, not forgery)."""

HEX_LENGTH = {"crc64nvme": 16, "crc32c": 8, "crc32": 8, "sha1": 40, "sha256": 64, "md5": 32,
              "git-sha1": 40}
"""The length each content kind's value must have: a mock server that falls back to a
weaker algorithm (CRC32 for CRC64NVME) is caught by its length."""

STRENGTHS = ("change-detector", "version-pin", "content-digest")


class ObjectPin(NamedTuple):
    key: str
    """Relative to the prefix, in path text encoding."""
    size: int
    version: str | None
    kind: str
    checksum: str | None
    etag: str | None

    def strength(self) -> str:
        if self.kind in CONTENT_KINDS:
            return "content-digest"
        return "version-pin" if self.version else "change-detector"

    def line(self) -> bytes:
        fields = (str(self.size), self.version or "-", self.kind, self.checksum or "-",
                  self.etag or "-", self.key)
        return ("o\t" + "\t".join(fields) + "\n").encode("utf-8")


def _field(value: str, what: str) -> str:
    if not value or any(ch in value for ch in "\t\n\r") or value == "-":
        raise DataError(f"the provider returned an unusable {what} {value!r}.")
    return value


def make_pin(key_bytes: bytes, size: int, version: str | None, kind: str,
             checksum: str | None, etag: str | None) -> ObjectPin:
    """An object's pin, with every field checked (a TAB in a version id would forge lines)."""
    if kind in HEX_LENGTH and (checksum is None or len(checksum) != HEX_LENGTH[kind]):
        raise DataError(f"the provider's {kind} checksum of {path_text(key_bytes)} has "
                        f"{len(checksum or '')} hex digits, not {HEX_LENGTH[kind]}.")
    return ObjectPin(path_text(key_bytes), size,
                     _field(version, "version") if version else None, kind,
                     _field(checksum, "checksum") if checksum else None,
                     _field(etag.strip('"'), "ETag") if etag and etag.strip('"') else None)


class PinSink:
    """Takes pins in key order; feeds the root's hasher and the store blob as they come."""

    def __init__(self, writer: BlobWriter | None, label: str) -> None:
        self.label = label
        self.root = blake3.blake3(derive_key_context=PINS_CONTEXT)
        self.writer = writer
        self.last: bytes | None = None
        self.objects = 0
        self.total_bytes = 0
        self.kinds: Counter[str] = Counter()
        self.versioned = 0
        self.weakest = len(STRENGTHS) - 1
        self._add(PINS_HEADER.encode() + b"\n")

    def _add(self, piece: bytes) -> None:
        self.root.update(piece)
        if self.writer is not None:
            self.writer.write(piece)

    def add(self, pin: ObjectPin) -> None:
        raw = path_bytes(pin.key)
        if self.last is not None and raw <= self.last:
            raise DataError(f"the listing of {self.label} is not in key order at {pin.key} "
                            "(S3 and GCS list keys in UTF-8 binary order).")
        self.last = raw
        self._add(pin.line())
        self.objects += 1
        self.total_bytes += pin.size
        self.kinds[pin.kind] += 1
        self.versioned += pin.version is not None
        self.weakest = min(self.weakest, STRENGTHS.index(pin.strength()))

    def strength(self) -> str:
        return STRENGTHS[self.weakest]

    def root_text(self) -> str:
        return "blake3:" + self.root.hexdigest()


def pins_root(listing: bytes) -> str:
    return "blake3:" + blake3.blake3(listing, derive_key_context=PINS_CONTEXT).hexdigest()


def parse_pins(listing: bytes) -> dict[str, ObjectPin]:
    """Key -> pin of a ``manifest-remote/v1`` blob (DataError if malformed)."""
    try:
        text = listing.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError("the recorded remote pins are not UTF-8 text.") from None
    lines = text.split("\n")
    if lines[0] != PINS_HEADER or lines[-1] != "":
        raise DataError(f"the recorded remote pins are not a {PINS_HEADER} listing.")
    pins: dict[str, ObjectPin] = {}
    for line in lines[1:-1]:
        fields = line.split("\t")
        if len(fields) != 7 or fields[0] != "o" or not fields[1].isdecimal():
            raise DataError("the recorded remote pins have a malformed line.")
        _, size, version, kind, checksum, etag, key = fields
        pins[key] = ObjectPin(key, int(size), None if version == "-" else version, kind,
                              None if checksum == "-" else checksum,
                              None if etag == "-" else etag)
    return pins


def describe_change(old: ObjectPin, new: ObjectPin) -> str:
    """Which facts of one object differ, e.g. ``version 3a… → 9f…, size 5 → 6``."""
    parts: list[str] = []
    if old.version != new.version:
        parts.append(f"version {_short(old.version)} → {_short(new.version)}")
    if old.size != new.size:
        parts.append(f"size {old.size} → {new.size} bytes")
    if (old.kind, old.checksum) != (new.kind, new.checksum):
        parts.append(f"{old.kind} {_short(old.checksum)} → {new.kind} {_short(new.checksum)}")
    if old.etag != new.etag:
        parts.append(f"ETag {_short(old.etag)} → {_short(new.etag)}")
    return ", ".join(parts) or "pin"


def _short(value: str | None) -> str:
    if value is None:
        return "none"
    return value if len(value) <= 12 else value[:10] + "…"
