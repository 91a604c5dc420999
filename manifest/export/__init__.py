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
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()
