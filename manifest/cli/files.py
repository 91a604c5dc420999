"""Reading a manifest and writing a document: the file handling the verbs share.

Nearly every verb reads a manifest or writes a document, and they must do it the
same way: a manifest comes from a file, ``-`` (stdin) or a
pack (show, diff, pack, sign and attest unpack it here; verify hands the
raw bytes to its library, which reads packs itself); a document
goes to stdout or, with ``-o FILE``, is written atomically, so a crash never
leaves half a manifest. The library calls are imported inside each helper:
``manifest --help`` loads none of them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from manifest.travel.sign import SignatureCheck


def write_output(data: bytes, output: str | None) -> None:
    """Write a document to ``output`` atomically, or to stdout."""
    if output is None or output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    from manifest.store import atomic_write

    atomic_write(Path(output), data)


def read_manifest_file(path: str) -> bytes:
    """The bytes of a manifest file or pack (``-``: stdin): a regular file under the size cap."""
    from manifest import canonical

    return canonical.read_manifest_file(path)


def unpacked(data: bytes) -> bytes:
    """The manifest bytes of a manifest file or a (checked) pack."""
    from manifest.travel.pack import manifest_bytes_of

    return manifest_bytes_of(data)


def signature_check(file: str, data: bytes, explicit: str | None, *,
                    accept_untrusted: bool) -> SignatureCheck | None:
    """The signature beside ``file`` (or in its pack) checked against the trust policy."""
    from manifest.travel.sign import check_input_signature

    return check_input_signature(file, data, cwd=Path.cwd(), explicit=explicit,
                                 accept_untrusted=accept_untrusted)


def write_pack(manifest_bytes: bytes, output: str, cwd: Path,
               signature: bytes | None = None, *, with_outputs: bool = False) -> None:
    """A pack of the manifest and the blobs it references, from the run's store (and, with
    ``with_outputs``, its declared output files from the run's tree)."""
    from manifest.canonical import load_manifest
    from manifest.rerun.workspace import repo_root_of, store_for
    from manifest.travel.pack import pack_from_store

    root = repo_root_of(cwd) or cwd
    store = store_for(load_manifest(manifest_bytes), root)
    write_output(pack_from_store(manifest_bytes, store, signature,
                                 outputs_root=root if with_outputs else None), output)
