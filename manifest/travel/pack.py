"""``manifest pack``: one file holding a manifest and every blob it references.

A manifest alone cannot leave the machine that made it: a dirty run's patch
and each dataset's listing live in the local store (``.manifest/blobs``), so
on a fresh clone ``verify`` has no tree to rebuild. A pack carries them.

Format (``manifest-pack/v1``): a ZIP archive (stdlib ``zipfile``, readable by
any unzip tool) whose entries are exactly

* ``manifest.json``: the manifest's canonical bytes;
* ``blobs/blake3-<hex>``: one per blob the manifest names (``code.diff_digest``,
  each ``data[].listing``, each ``outputs.processes[].ops`` op stream), each the
  bytes whose blake3 is ``<hex>``;
* ``signature.sigstore.json`` (optional): a signature over the manifest
  (``manifest sign``, see :mod:`manifest.travel.sign`);
* ``outputs/blake3-<hex>`` (``pack --with-outputs``): one per declared output file
  (``outputs.artifacts``), the bytes the run wrote, named by the artifact's recorded
  digest. Without them a verifier elsewhere has nothing to hold its re-run's numbers to
  (``equivalent`` needs the recorded weights); ``verify --outputs DIR`` is the way for
  outputs too large for a pack or made of several files (a DCP directory, shards).

What a rebuild of the run's environment needs is in the manifest itself (``env``: each
distribution's version, wheel tags, where it came from and a digest of its files), so a
pack carries no wheels: they come from the indexes the record names, and the project's
own code from the recorded commit and patch (a blob here).

Entries are sorted, deflated and dated 1980-01-01, so one run packs to the same
bytes on any machine. Reading is an allow-list: any other name, a symlink, a
duplicated name, an entry whose uncompressed size is over 100× its compressed
size (above 1 MiB; the same for the whole pack) or over 1 GiB, a blob the
manifest does not name (refused before it is inflated), a blob whose content
does not match its name or a named blob that is missing is refused with one
sentence (exit 2); an output entry is held to the same rules against the manifest's
output digests. Nothing is ever extracted next to the user's files: entries are read into
memory under those limits, verify reads blobs through
:class:`~manifest.store.OverlayStore` (the local store, then the pack's) and writes a
packed output, checked, only into its scratch directory (the weight readers map files).

A pack is read whole by the bounded reader, under its cap (64 MiB unless
``MANIFEST_MAX_BYTES`` says more): ``pack --with-outputs`` refuses to write a pack over
that cap, so what it writes is what a verifier here can read.
"""

from __future__ import annotations

import io
import re
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from manifest.errors import InvalidManifestError
from manifest.models import Manifest
from manifest.store import BlobStore

PACK_MAGIC = b"PK\x03\x04"
MANIFEST_ENTRY = "manifest.json"
SIGNATURE_ENTRY = "signature.sigstore.json"
_BLOB_ENTRY = re.compile(r"blobs/blake3-([0-9a-f]{64})")
_OUTPUT_ENTRY = re.compile(r"outputs/blake3-([0-9a-f]{64})")
SINGLE_FILE_FORMATS = ("safetensors", "torch", "file")
"""Output formats a pack carries: one file each (a DCP directory or a sharded index is
several, and travels beside the pack: ``verify --outputs DIR``)."""
MAX_ENTRY_BYTES = 1 << 30
"""A blob larger than 1 GiB is not a patch or a listing this tool wrote (a listing of
ten million files is about 900 MB)."""
MAX_TOTAL_BYTES = 1 << 30
MAX_RATIO = 100
"""Deflate reaches about 1000× on runs of zeros; real listings and patches stay
below 10×. Entries under :data:`_RATIO_FLOOR` are exempt (a small patch of
repeated lines may legitimately compress well)."""
_RATIO_FLOOR = 1 << 20
_EPOCH = (1980, 1, 1, 0, 0, 0)


class PackError(InvalidManifestError):
    """A pack that is not exactly what ``manifest pack`` writes (exit 2)."""


@dataclass(frozen=True)
class Pack:
    """The checked content of a pack: manifest bytes, blobs by name, signature."""

    manifest: bytes
    blobs: dict[str, bytes] = field(default_factory=dict)
    signature: bytes | None = None
    outputs: dict[str, bytes] = field(default_factory=dict)
    """Declared output files by their recorded digest (``pack --with-outputs``)."""


def is_pack(data: bytes) -> bool:
    return data[:4] == PACK_MAGIC


def referenced_blobs(manifest: Manifest) -> list[str]:
    """Every blob a manifest names (patch, dataset listings, op streams), in order, unique."""
    names = [manifest.code.diff_digest] + [ds.listing for ds in manifest.data]
    if manifest.outputs is not None:
        names += [p.ops.digest for p in manifest.outputs.processes if p.ops is not None]
    return list(dict.fromkeys(n for n in names if n is not None))


def packable_outputs(manifest: Manifest) -> list[str]:
    """The recorded digests of the outputs a pack may carry (single files), unique."""
    artifacts = manifest.outputs.artifacts if manifest.outputs is not None else []
    return list(dict.fromkeys(a.digest for a in artifacts if a.format in SINGLE_FILE_FORMATS))


def read_outputs(manifest: Manifest, root: Path, *, already: int = 0) -> dict[str, bytes]:
    """The declared outputs' bytes as the run wrote them (``pack --with-outputs``), read from
    the run's tree at ``root`` (each at its recorded size, never through a link out of the
    tree) and checked against the recorded digest; anything else is one sentence (exit 2).
    ``already``: bytes the pack holds besides; with the outputs, uncompressed (weights
    deflate by a few percent), they must stay under the cap a verifier reads packs with."""
    from manifest.bounded import max_manifest_bytes
    from manifest.errors import ManifestError
    from manifest.weights.mapped import MappedFile
    from manifest.weights.raw import hash_bytes

    if manifest.outputs is None or manifest.command is None or not manifest.outputs.artifacts:
        raise PackError("the manifest declares no output file: there is nothing for "
                        "--with-outputs to carry.")
    cap = min(max_manifest_bytes(), MAX_TOTAL_BYTES)
    total = already
    out: dict[str, bytes] = {}
    for artifact in manifest.outputs.artifacts:
        if artifact.format not in SINGLE_FILE_FORMATS:
            raise PackError(f"the output {artifact.path} is a checkpoint of several files "
                            f"({artifact.format}): a pack carries single-file outputs only.",
                            hint="Send its folder beside the pack; the verifier names it "
                            "with verify --outputs DIR.")
        total += artifact.bytes
        if total > cap:
            raise PackError(f"the pack would hold {total} bytes with the output "
                            f"{artifact.path}, over the {cap} bytes a verifier reads "
                            "(MANIFEST_MAX_BYTES).",
                            hint="Send them beside the pack; the verifier names their folder "
                            "with verify --outputs DIR.")
        try:
            with MappedFile(root / manifest.command.cwd / artifact.path, size=artifact.bytes,
                            within=root, shown=artifact.path) as mapped:
                data = bytes(mapped.view)
        except ManifestError as exc:
            raise PackError(f"cannot pack the output {artifact.path}: "
                            f"{exc.message.rstrip('.')}.") from exc
        if hash_bytes(data) != artifact.digest:
            raise PackError(f"the output {artifact.path} changed since capture (its digest is "
                            "not the recorded one): a pack carries the recorded outputs only.",
                            hint="Pack where the run's outputs are as it wrote them.")
        out[artifact.digest] = data
    return out


def _entry(name: str, data: bytes) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name, date_time=_EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (stat.S_IFREG | 0o444) << 16
    info.create_system = 3  # unix, so the mode bits above are read as such
    return info, data


def build_pack(manifest_bytes: bytes, blobs: Mapping[str, bytes],
               signature: bytes | None = None, outputs: Mapping[str, bytes] | None = None
               ) -> bytes:
    """The bytes of a pack; ``blobs`` must be exactly the manifest's, ``outputs`` (by
    recorded digest) among its single-file outputs: both content-checked here."""
    from manifest.canonical import load_manifest

    manifest = load_manifest(manifest_bytes)
    entries = [_entry(MANIFEST_ENTRY, manifest_bytes)]
    for name in sorted(referenced_blobs(manifest)):
        data = blobs.get(name)
        if data is None:
            raise PackError(f"blob {name} that the manifest references is not available.")
        if "blake3:" + blake3.blake3(data).hexdigest() != name:
            raise PackError(f"blob {name} does not match its content address.")
        entries.append(_entry("blobs/" + name.replace(":", "-", 1), data))
    declared = packable_outputs(manifest)
    for name, data in sorted((outputs or {}).items()):
        if name not in declared:
            raise PackError(f"output {name} is not one of the manifest's single-file outputs.")
        if "blake3:" + blake3.blake3(data).hexdigest() != name:
            raise PackError(f"output {name} does not match its content address.")
        entries.append(_entry("outputs/" + name.replace(":", "-", 1), data))
    if signature is not None:
        entries.append(_entry(SIGNATURE_ENTRY, signature))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for info, data in entries:
            zf.writestr(info, data, compresslevel=6)
    return out.getvalue()


def pack_from_store(manifest_bytes: bytes, store: BlobStore,
                    signature: bytes | None = None, *, outputs_root: Path | None = None
                    ) -> bytes:
    """Pack a manifest with its blobs read (and checked) from ``store``; with
    ``outputs_root`` (the run's tree), its declared output files too."""
    from manifest.canonical import load_manifest

    manifest = load_manifest(manifest_bytes)
    outputs = (read_outputs(manifest, outputs_root, already=len(manifest_bytes))
               if outputs_root is not None else None)
    blobs: dict[str, bytes] = {}
    for name in referenced_blobs(manifest):
        data = store.get(name)
        if data is None:
            raise PackError(
                f"blob {name} that the manifest references is missing from the store "
                f"{store.root} (or corrupted).",
                hint="Pack on the machine (and in the repository) that captured the run.")
        blobs[name] = data
    packed = build_pack(manifest_bytes, blobs, signature, outputs)
    if outputs:
        from manifest.bounded import max_manifest_bytes

        cap = min(max_manifest_bytes(), MAX_TOTAL_BYTES)
        if len(packed) > cap:
            raise PackError(f"the pack with its outputs is {len(packed)} bytes, over the "
                            f"{cap} bytes a verifier reads (MANIFEST_MAX_BYTES).",
                            hint="Send the outputs beside the pack; the verifier names their "
                            "folder with verify --outputs DIR.")
    return packed


def _check_entries(infos: Iterable[zipfile.ZipInfo]) -> list[zipfile.ZipInfo]:
    """Names, kinds and declared sizes, from the central directory alone (nothing read)."""
    seen: set[str] = set()
    total = packed = 0
    checked = []
    for info in infos:
        name = info.filename
        if name in seen:
            raise PackError(f"pack has the entry {name!r} twice.")
        seen.add(name)
        if name not in (MANIFEST_ENTRY, SIGNATURE_ENTRY) and not (
                _BLOB_ENTRY.fullmatch(name) or _OUTPUT_ENTRY.fullmatch(name)):
            raise PackError(f"pack has an unexpected entry {name!r} (a pack holds manifest.json, "
                            "blobs/blake3-<hex>, outputs/blake3-<hex> and "
                            "signature.sigstore.json only).")
        mode = info.external_attr >> 16
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: written without unix mode bits
            raise PackError(f"pack entry {name!r} is not a regular file (a symlink or device).")
        if info.file_size > MAX_ENTRY_BYTES:
            raise PackError(f"pack entry {name!r} declares {info.file_size} bytes, over the "
                            f"{MAX_ENTRY_BYTES >> 20} MiB limit.")
        if (info.file_size > _RATIO_FLOOR
                and info.file_size > MAX_RATIO * max(info.compress_size, 1)):
            raise PackError(f"pack entry {name!r} expands {info.file_size} bytes from "
                            f"{info.compress_size}: over the {MAX_RATIO}:1 ratio limit "
                            "(a zip bomb?).")
        total += info.file_size
        packed += info.compress_size
        # The same limits over the whole pack: many small entries, each under the
        # ratio floor, must not add up to a bomb either.
        if total > MAX_TOTAL_BYTES or (total > _RATIO_FLOOR and total > MAX_RATIO * packed):
            raise PackError(f"pack expands to {total} bytes from {packed}: over the "
                            f"{MAX_TOTAL_BYTES >> 20} MiB or {MAX_RATIO}:1 limit (a zip bomb?).")
        checked.append(info)
    return checked


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> bytes:
    with zf.open(info) as fh:
        # ZipExtFile stops at the declared size and checks the CRC at the end.
        body = fh.read(info.file_size + 1)
    if len(body) != info.file_size:
        raise PackError(f"{what} entry {info.filename!r} is not the size it declares.")
    return body


def read_pack(data: bytes, *, what: str = "pack") -> Pack:
    """Open and check a pack held in memory; raise :class:`PackError` for any fault.

    The manifest is read first, so a blob it does not name is refused before
    its bytes are inflated.
    """
    from manifest.canonical import load_manifest

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            infos = {info.filename: info for info in _check_entries(zf.infolist())}
            if MANIFEST_ENTRY not in infos:
                raise PackError(f"{what} has no {MANIFEST_ENTRY}.")
            manifest_bytes = _read_entry(zf, infos.pop(MANIFEST_ENTRY), what)
            manifest = load_manifest(manifest_bytes)
            wanted = referenced_blobs(manifest)
            declared = packable_outputs(manifest)
            signature = (_read_entry(zf, infos.pop(SIGNATURE_ENTRY), what)
                         if SIGNATURE_ENTRY in infos else None)
            blobs: dict[str, bytes] = {}
            outputs: dict[str, bytes] = {}
            for name, info in sorted(infos.items()):
                digest = "blake3:" + name.rsplit("-", 1)[1]
                output = name.startswith("outputs/")
                if digest not in (declared if output else wanted):
                    raise PackError(
                        f"{what} holds the {'output' if output else 'blob'} {digest} that its "
                        f"manifest does not {'declare' if output else 'reference'}.")
                body = _read_entry(zf, info, what)
                if "blake3:" + blake3.blake3(body).hexdigest() != digest:
                    raise PackError(f"{what} entry {name} does not match its content address: "
                                    f"the {'output' if output else 'blob'} was altered.")
                (outputs if output else blobs)[digest] = body
    except zipfile.BadZipFile as exc:
        raise PackError(f"{what} is truncated or corrupt ({exc}).") from exc
    except (EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error, OSError,
            struct.error, OverflowError) as exc:  # a corrupt deflate stream raises zlib.error
        raise PackError(f"{what} cannot be read: {exc}.") from exc
    missing = [n for n in wanted if n not in blobs]
    if missing:
        raise PackError(f"{what} lacks the blob {missing[0]} that its manifest references.")
    return Pack(manifest_bytes, blobs, signature, outputs)


def manifest_bytes_of(data: bytes) -> bytes:
    """The manifest bytes of a manifest file or of a (checked) pack."""
    return read_pack(data).manifest if is_pack(data) else data
