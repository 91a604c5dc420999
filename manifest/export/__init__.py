"""Bills of materials from a manifest: CycloneDX 1.6 and SPDX 3.0.1 (``manifest export``).

Supply-chain reviewers ingest these two formats, not ours. Both carry the same
mapping of a run (:mod:`manifest.export.mapping`): the code (commit, patch
digest, lockfiles), each dataset and each output model with its BLAKE3 digest
(an algorithm both formats name), the software environment (every installed
distribution as a package URL), the hardware, the command's seed and flags,
and the compute record. Documents are deterministic: identifiers derive from
the run's ``run_id`` and times from the manifest, so exporting twice gives the
same bytes.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from manifest.models import Manifest


class ExportFormat(StrEnum):
    CYCLONEDX = "cyclonedx"
    SPDX3 = "spdx3"


def export_manifest(manifest: Manifest, fmt: ExportFormat) -> bytes:
    """The document for ``fmt`` as UTF-8 JSON, newline-terminated."""
    if fmt is ExportFormat.CYCLONEDX:
        from manifest.export.cyclonedx import cyclonedx_document

        doc = cyclonedx_document(manifest)
    else:
        from manifest.export.spdx3 import spdx3_document

        doc = spdx3_document(manifest)
    return (safe_json(doc) + "\n").encode()


def safe_json(doc: object, *, indent: int | None = 2) -> str:
    """JSON with no character that acts on a terminal or reorders text, same data.

    A manifest's strings are someone else's (a dataset name, a package version,
    a hostname); a reviewer reads an export with ``cat`` or in a web view. JSON
    escapes only C0 controls, so bidi overrides (U+202A–U+202E, U+2066–U+2069),
    line and paragraph separators (U+2028, U+2029), DEL, C1 controls and other
    format characters would pass raw. Each becomes ``\\uXXXX``, which JSON reads
    back as the same character. Every JSON document the CLI prints goes through
    here too (``manifest.cli.text.json_text``): one rule.
    """
    text = json.dumps(doc, indent=indent, ensure_ascii=False)
    if text.replace("\n", "").isprintable():
        return text
    return "".join(ch if ch == "\n" or ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
