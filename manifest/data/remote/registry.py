"""Which class serves which bucket scheme: a table of import paths, imported on first use.

fsspec's ``registry.py`` pattern: each provider is named by its dotted path with the
extra that installs its client library, so ``manifest --help`` and ``diff`` load none of
boto3, google-cloud-storage, huggingface_hub or deltalake, and the providers, which
import their shared pieces from :mod:`manifest.data.remote.source`, never import this
module back (a registry that imports its providers while they import constants from it
is an import circle).
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from manifest.data.remote.source import Source
from manifest.data.remote.url import RemoteURL
from manifest.errors import DataError


class Provider(NamedTuple):
    module: str
    cls: str
    extra: str
    """``pip install 'torch-manifest[EXTRA]'`` installs its client library."""
    revisioned: bool
    """Whether the class takes a revision (a Hub commit, a Delta table version)."""


PROVIDERS: dict[str, Provider] = {
    "s3": Provider("manifest.data.remote.s3", "S3Source", "s3", revisioned=False),
    "gcs": Provider("manifest.data.remote.gcs", "GCSSource", "gcs", revisioned=False),
    "hf": Provider("manifest.data.remote.hf", "HubSource", "hf", revisioned=True),
    "delta": Provider("manifest.data.remote.delta", "DeltaSource", "delta", revisioned=True),
}


def open_source(url: RemoteURL, endpoint: str | None, revision: str | None = None) -> Source:
    """The provider's source; :class:`DataError` naming the extra if its library is missing."""
    entry = PROVIDERS[url.provider]
    try:
        cls = getattr(importlib.import_module(entry.module), entry.cls)
        source: Source = (cls(url, endpoint, revision) if entry.revisioned
                          else cls(url, endpoint))
    except ImportError as exc:
        raise DataError(f"pinning {url.text()} needs the '{entry.extra}' extra ({exc.name} is "
                        "not installed).",
                        hint=f"pip install 'torch-manifest[{entry.extra}]'") from None
    return source
