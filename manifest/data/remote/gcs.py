"""Google Cloud Storage: pins from the object listing, no body read.

What GCS offers in a listing (JSON API ``objects.list``, checked): per object
its name, size, generation (a new one for every write: a version pin, gone
once that generation is deleted or, without object versioning, overwritten),
``crc32c`` (for every object, composite objects included, since CRC32C
composes: a content checksum) and ``md5Hash`` (absent for composite objects).
Names come in lexicographic (UTF-8 binary) order, so pins stream. CRC32C is
preferred when no MD5 is given; MD5 when it is.

Credentials: google-cloud-storage's Application Default Credentials; never
recorded. ``STORAGE_EMULATOR_HOST`` points the client at an emulator.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from typing import Any

from manifest.data.remote.pins import ObjectPin, make_pin
from manifest.data.remote.source import CHUNK
from manifest.data.remote.url import RemoteURL, scrub
from manifest.errors import DataError


class GCSSource:
    def __init__(self, url: RemoteURL, endpoint: str | None) -> None:
        from google.cloud import storage

        self.url = url
        self.endpoint = endpoint
        if endpoint:  # an emulator: no credentials to look for
            from google.auth.credentials import AnonymousCredentials

            self.client: Any = storage.Client(project="manifest",
                                              credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
        else:
            self.client = storage.Client()

    def _fail(self, exc: BaseException, what: str) -> DataError:
        return gcs_error(exc, self.url, what)

    def list_pins(self, add: Callable[[ObjectPin], None], *, checksums: bool) -> str | None:
        prefix = self.url.prefix
        try:
            for blob in self.client.list_blobs(self.url.bucket, prefix=prefix or None):
                rel = blob.name.encode("utf-8")[len(prefix.encode()):]
                if blob.md5_hash:
                    kind, value = "md5", base64.b64decode(blob.md5_hash).hex()
                elif blob.crc32c:
                    kind, value = "crc32c", base64.b64decode(blob.crc32c).hex()
                else:
                    kind, value = ("etag" if blob.etag else "none"), None
                add(make_pin(rel, int(blob.size or 0),
                             str(blob.generation) if blob.generation else None, kind, value,
                             blob.etag))
        except DataError:
            raise
        except Exception as exc:
            raise self._fail(exc, "list") from None
        return None

    def _blob(self, pin: ObjectPin) -> Any:
        from manifest.data.listing import path_bytes

        name = (self.url.prefix.encode() + path_bytes(pin.key)).decode()
        generation = int(pin.version) if pin.version else None
        return self.client.bucket(self.url.bucket).blob(name, generation=generation)

    def read(self, pin: ObjectPin) -> Iterator[bytes]:
        try:
            with self._blob(pin).open("rb", chunk_size=CHUNK) as handle:
                while chunk := handle.read(CHUNK):
                    yield chunk
        except Exception as exc:
            raise self._fail(exc, f"read {pin.key} of") from None

    def drift(self) -> list[str]:
        return []  # a bucket has no revision besides its objects' versions

    def version_readable(self, pin: ObjectPin) -> bool:
        try:
            return bool(self._blob(pin).exists())
        except Exception as exc:
            raise self._fail(exc, f"look up {pin.key} of") from None


def gcs_error(exc: BaseException, url: RemoteURL, what: str) -> DataError:
    """One sentence for a failed GCS call (never a token)."""
    where = url.text()
    code = getattr(exc, "code", None)
    name = type(exc).__name__
    if name == "DefaultCredentialsError":
        return DataError(f"cannot {what} {where}: no Google Cloud credentials were found.",
                         hint="Run 'gcloud auth application-default login' or set "
                              "GOOGLE_APPLICATION_CREDENTIALS.")
    if code in (401, 403):
        return DataError(f"cannot {what} {where}: access denied.",
                         hint="The credentials need storage.objects.list "
                              "(and storage.objects.get for --deep).")
    if code == 404:
        return DataError(f"cannot {what} {where}: bucket {url.bucket} does not exist.")
    if code == 429:
        return DataError(f"cannot {what} {where}: GCS kept throttling after retries with "
                         "backoff.", hint="Try again later.")
    message = str(exc).splitlines()[0] if str(exc) else name
    return DataError(f"cannot {what} {where}: {scrub(message).rstrip('.')}.")
