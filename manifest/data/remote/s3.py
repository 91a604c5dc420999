"""S3 (and S3-compatible stores): pins from ``ListObjectVersions``, no body read.

What S3 offers without reading an object (AWS S3 API reference, checked):

* ``ListObjectVersions`` gives, per object, key, size, ETag and version id,
  1000 to a page, keys in UTF-8 binary order; a bucket that never had
  versioning (``GetBucketVersioning``) is listed with ``ListObjectsV2``, the
  same facts without version ids. One call per 1000 objects: pinning costs what a bare
  paginated listing costs (``benchmarks/remote_pinning.py``).
* A version id names bytes that never change: a *version pin*. It is gone once
  the version is deleted or expired by a lifecycle rule.
* The ETag of a single-part upload is the MD5 of the bytes only for SSE-S3 or
  unencrypted objects; with SSE-KMS/SSE-C it is not, and a listing does not
  say which. A multipart ETag (``…-N``) is the MD5 of the parts' MD5s. Both
  are recorded as change detectors.
* ``HeadObject`` with ``ChecksumMode=ENABLED`` returns the additional checksum
  (``--checksums``: one HEAD per object, still no body): CRC64NVME, which S3
  adds to every object uploaded without a checksum, always covers the full
  object; a checksum with ``ChecksumType: COMPOSITE`` (or a ``-N`` suffix) is a
  checksum of part checksums, not of the bytes.

Credentials come from boto3's standard chain and are never recorded.
Throttling (``SlowDown``, 503) is retried by botocore's standard mode with
exponential backoff, up to :data:`ATTEMPTS` tries.
"""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any

from manifest.data.remote.pins import ObjectPin, make_pin
from manifest.data.remote.source import CHUNK
from manifest.data.remote.url import RemoteURL
from manifest.errors import DataError

ATTEMPTS = 8
HEAD_WORKERS = 32
ALGORITHMS = ("SHA256", "SHA1", "CRC64NVME", "CRC32C", "CRC32")
"""Preferred first: a cryptographic digest, then the CRCs."""

_DENIED = {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "403", "ExpiredToken", "InvalidToken", "AccountProblem"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
              "TooManyRequests", "503"}


class S3Source:
    def __init__(self, url: RemoteURL, endpoint: str | None) -> None:
        import boto3
        from botocore.config import Config

        self.url = url
        self.endpoint = endpoint
        config = Config(retries={"mode": "standard", "max_attempts": ATTEMPTS},
                        max_pool_connections=HEAD_WORKERS, user_agent_extra="torch-manifest")
        # The endpoint is only ever today's, from the user's environment (see url.py).
        self.client: Any = boto3.session.Session().client("s3", endpoint_url=endpoint,
                                                          config=config)

    def _fail(self, exc: BaseException, what: str) -> DataError:
        return s3_error(exc, self.url, what)

    def _versioned(self) -> bool:
        """Whether the bucket keeps versions (asked once; unknown counts as yes)."""
        try:
            status = self.client.get_bucket_versioning(Bucket=self.url.bucket).get("Status")
        except Exception as exc:
            if _code(exc) in _DENIED:
                return True  # no s3:GetBucketVersioning: list versions anyway
            raise
        return status in ("Enabled", "Suspended")

    def list_pins(self, add: Callable[[ObjectPin], None], *, checksums: bool) -> str | None:
        prefix = self.url.prefix
        try:
            # A bucket that never kept versions is listed with ListObjectsV2 (the same
            # facts, version ids all "null"); a suspended one may still hold versions.
            versioned = self._versioned()
            operation = "list_object_versions" if versioned else "list_objects_v2"
            paginator = self.client.get_paginator(operation)
            for page in paginator.paginate(Bucket=self.url.bucket, Prefix=prefix):
                current = ([v for v in page.get("Versions", ()) if v.get("IsLatest")]
                           if versioned else page.get("Contents", []))
                if checksums:
                    with concurrent.futures.ThreadPoolExecutor(HEAD_WORKERS) as pool:
                        pins = list(pool.map(self._head_pin, current))
                else:
                    pins = [self._listed_pin(v) for v in current]
                for pin in pins:
                    add(pin)
        except DataError:
            raise
        except Exception as exc:
            raise self._fail(exc, "list") from None
        return None

    def _key(self, key: str) -> bytes:
        return key.encode("utf-8", "surrogateescape")[len(self.url.prefix.encode()):]

    def _listed_pin(self, v: dict[str, Any]) -> ObjectPin:
        etag = v.get("ETag")
        kind = "etag-multipart" if etag and "-" in etag else "etag" if etag else "none"
        return make_pin(self._key(v["Key"]), int(v["Size"]), _version(v.get("VersionId")), kind,
                        None, etag)

    def _head_pin(self, v: dict[str, Any]) -> ObjectPin:
        args: dict[str, Any] = {"Bucket": self.url.bucket, "Key": v["Key"],
                                "ChecksumMode": "ENABLED"}
        version = _version(v.get("VersionId"))
        if version:
            args["VersionId"] = version
        try:
            head = self.client.head_object(**args)
        except Exception as exc:
            raise self._fail(exc, f"read the metadata of {v['Key']}") from None
        etag = head.get("ETag") or v.get("ETag")
        kind, value = checksum_of(head, etag)
        return make_pin(self._key(v["Key"]), int(head.get("ContentLength", v["Size"])),
                        _version(head.get("VersionId")) or version, kind, value, etag)

    def read(self, pin: ObjectPin) -> Iterator[bytes]:
        from manifest.data.listing import path_bytes

        key = (self.url.prefix.encode() + path_bytes(pin.key)).decode("utf-8", "surrogateescape")
        args: dict[str, Any] = {"Bucket": self.url.bucket, "Key": key}
        if pin.version:
            args["VersionId"] = pin.version
        elif pin.etag:
            args["IfMatch"] = f'"{pin.etag}"'  # the bytes that were listed, or a refusal
        try:
            body = self.client.get_object(**args)["Body"]
            yield from body.iter_chunks(CHUNK)
        except Exception as exc:
            raise self._fail(exc, f"read {key}") from None

    def drift(self) -> list[str]:
        return []  # a bucket has no revision besides its objects' versions

    def version_readable(self, pin: ObjectPin) -> bool:
        from manifest.data.listing import path_bytes

        if not pin.version:
            return False
        key = (self.url.prefix.encode() + path_bytes(pin.key)).decode("utf-8", "surrogateescape")
        try:
            self.client.head_object(Bucket=self.url.bucket, Key=key, VersionId=pin.version)
        except Exception as exc:
            if _code(exc) in ("404", "NoSuchKey", "NoSuchVersion", "405", "MethodNotAllowed",
                              "400", "InvalidArgument"):
                return False  # 405: the version is a delete marker
            raise self._fail(exc, f"read the metadata of {key}") from None
        return True


def _version(value: str | None) -> str | None:
    return None if value in (None, "", "null") else value


def checksum_of(head: dict[str, Any], etag: str | None) -> tuple[str, str | None]:
    """(kind, hex value) of the best checksum a HeadObject response carries."""
    multipart = bool(etag and "-" in etag)
    for algorithm in ALGORITHMS:
        value = head.get(f"Checksum{algorithm}")
        if not value:
            continue
        raw, _, parts = value.partition("-")
        kind = algorithm.lower()
        declared = head.get("ChecksumType")
        composite = bool(parts) or declared == "COMPOSITE" or (
            declared is None and multipart and algorithm != "CRC64NVME")
        try:
            hexed = base64.b64decode(raw, validate=True).hex()
        except ValueError:
            raise DataError(f"S3 returned a {algorithm} checksum that is not base64.") from None
        return (f"{kind}-composite", hexed) if composite else (kind, hexed)
    encryption = head.get("ServerSideEncryption")
    if etag and not multipart and encryption in (None, "AES256") \
            and not head.get("SSECustomerAlgorithm"):
        return "md5", etag.strip('"')  # single-part, SSE-S3 or none: the ETag is the MD5
    return ("etag-multipart" if multipart else "etag") if etag else "none", None


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error") or {}
        code = str(error.get("Code") or "")
        status = str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")
        return code or status
    return ""


def s3_error(exc: BaseException, url: RemoteURL, what: str) -> DataError:
    """One sentence for a failed S3 call (never the credentials, never a traceback)."""
    from botocore import exceptions as bx

    where = url.text()
    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return DataError(f"cannot {what} {where}: no AWS credentials were found.",
                         hint="Set them the usual way (AWS_PROFILE, ~/.aws/credentials, "
                              "environment variables or an instance role).")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError
                  | bx.ReadTimeoutError):
        return DataError(f"cannot {what} {where}: the S3 endpoint cannot be reached.",
                         hint="Check the network, or AWS_ENDPOINT_URL_S3 for an S3-compatible "
                              "store.")
    code = _code(exc)
    if code in _DENIED:
        return DataError(f"cannot {what} {where}: access denied ({code}).",
                         hint="The credentials from the standard chain need s3:ListBucket and "
                              "s3:ListBucketVersions (and s3:GetObject for --deep).")
    if code in ("NoSuchBucket",) or (code == "404" and what == "list"):
        return DataError(f"cannot {what} {where}: bucket {url.bucket} does not exist.")
    if code in _THROTTLED:
        return DataError(f"cannot {what} {where}: S3 kept throttling after {ATTEMPTS} "
                         "attempts with backoff.", hint="Try again later.")
    if code == "PreconditionFailed":
        return DataError(f"cannot {what} {where}: the object changed since it was listed.",
                         hint="Capture again once nothing is writing to the prefix.")
    if code in ("NoSuchKey", "404", "NoSuchVersion"):
        return DataError(f"cannot {what} {where}: the object is gone.")
    from manifest.data.remote.url import scrub

    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DataError(f"cannot {what} {where}: {scrub(message).rstrip('.')}.")
