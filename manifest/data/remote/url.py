"""What a remote ``--data`` URL names, and the endpoint it is read from.

``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX``,
``hf://datasets/ORG/NAME@REVISION[/PATH]`` (``REVISION`` defaults to ``main``
and is resolved to a commit at capture) and ``delta:///ABSOLUTE/PATH[@VERSION]``
(a Delta Lake table in a local or mounted folder, the path absolute like a
``file:///`` URL's; ``VERSION`` is a table version, by default the latest,
resolved at capture). A non-empty bucket prefix is a folder: ``s3://b/data``
pins the keys under ``data/``, never ``data-old/x``.

The endpoint is never taken from a manifest. It comes from the same variables
the provider's own tools read (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``,
``STORAGE_EMULATOR_HOST``, ``HF_ENDPOINT``), so a crafted manifest cannot send
this user's credentials (a GCS or Hub bearer token travels in full) to a host
it chose. It is recorded without userinfo, query or fragment; verify compares
today's with the recorded one and names a difference instead of following it.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

from manifest.errors import DataError

SCHEMES = ("s3://", "gs://", "hf://", "delta://")

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HF_REV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


class RemoteURL(NamedTuple):
    provider: str
    """``s3``, ``gcs``, ``hf`` or ``delta``."""
    bucket: str
    """The bucket, the Hub repository id ``ORG/NAME``, or the Delta table's absolute path."""
    prefix: str
    """Keys below this (``""`` or ending in ``/``); a path inside the Hub repository."""
    revision: str | None
    """The Hub revision as written (branch, tag or commit); the Delta version as
    written (None: the latest)."""

    def text(self) -> str:
        """The canonical URL, as recorded in ``Dataset.path``."""
        if self.provider == "delta":
            return f"delta://{self.bucket}" + (f"@{self.revision}" if self.revision else "")
        if self.provider == "hf":
            tail = f"/{self.prefix.rstrip('/')}" if self.prefix else ""
            return f"hf://datasets/{self.bucket}@{self.revision}{tail}"
        scheme = "s3" if self.provider == "s3" else "gs"
        return f"{scheme}://{self.bucket}/{self.prefix}"


def is_remote(spec: str) -> bool:
    """Whether a ``--data`` value (after any ``NAME=``) names remote data."""
    return spec.startswith(SCHEMES)


def parse_url(text: str) -> RemoteURL:
    """Parse a remote data URL; :class:`DataError` with one sentence if malformed."""
    from manifest.redact import redact_url

    if "\0" in text or any(ord(ch) < 0x20 for ch in text):
        raise DataError(f"remote dataset {redact_url(text)!r} contains a control character.")
    if redact_url(text) != text or (not text.startswith("delta://") and any(
            ch in text for ch in "?#")):
        raise DataError(
            f"--data {redact_url(text)} carries a user, a query or a fragment: a dataset is "
            "named by its URL alone.",
            hint="Give credentials the provider's usual way (AWS_PROFILE, "
                 "GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN …), never in the URL.")
    if text.startswith("hf://"):
        return _parse_hf(text)
    if text.startswith("delta://"):
        return _parse_delta(text)
    scheme, rest = text.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise DataError(f"{text} does not name a valid bucket.",
                        hint=f"Write {scheme}://BUCKET/PREFIX.")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if any(part in ("", ".", "..") for part in prefix.split("/")[:-1]):
        raise DataError(f"the prefix of {text} has an empty, '.' or '..' component.")
    return RemoteURL("s3" if scheme == "s3" else "gcs", bucket, prefix, None)


def _parse_hf(text: str) -> RemoteURL:
    rest = text.removeprefix("hf://")
    if not rest.startswith("datasets/"):
        raise DataError(f"{text} is not a Hub dataset URL.",
                        hint="Write hf://datasets/ORG/NAME@REVISION.")
    rest = rest.removeprefix("datasets/")
    org, _, tail = rest.partition("/")
    name, _, path = tail.partition("/")
    revision = "main"
    if "@" in name:
        name, _, revision = name.partition("@")
    elif "@" in path:
        raise DataError(f"{text}: write the revision after the dataset name (NAME@REV).")
    repo = f"{org}/{name}"
    if not _HF_ID.match(repo) or ".." in repo:
        raise DataError(f"{text} does not name a Hub dataset ORG/NAME.")
    if not _HF_REV.match(revision) or ".." in revision:
        raise DataError(f"{text} has an invalid revision {revision!r}.")
    path = path.strip("/")
    if path and any(part in ("", ".", "..") for part in path.split("/")):
        raise DataError(f"the path of {text} has an empty, '.' or '..' component.")
    return RemoteURL("hf", repo, path + "/" if path else "", revision)


def _parse_delta(text: str) -> RemoteURL:
    import posixpath

    rest = text.removeprefix("delta://")
    if not rest.startswith("/"):
        raise DataError(f"{text} does not name a table by its absolute path.",
                        hint="Write delta:///ABSOLUTE/PATH/TO/TABLE[@VERSION] (three slashes).")
    path, at, version = rest.rpartition("@")
    if not at or "/" in version:
        path, version = rest, ""
    elif not version.isdecimal() or len(version) > 19:
        raise DataError(f"{text} has an invalid table version {version!r}.",
                        hint="Write @VERSION with a whole number, or leave it out for the "
                             "latest.")
    path = path.rstrip("/") or "/"
    if any(part in (".", "..") for part in path.split("/")) or "//" in path:
        raise DataError(f"the path of {text} has an empty, '.' or '..' component.")
    return RemoteURL("delta", posixpath.normpath(path), "",
                     str(int(version)) if version else None)


def strip_userinfo(url: str) -> str:
    """``scheme://host[:port]/path`` of ``url``: no user, password, query or fragment.

    Through the project's one redactor (``manifest.redact``).
    """
    from manifest.redact import strip_url_credentials

    return strip_url_credentials(url).rstrip("/")


def scrub(message: str) -> str:
    """A provider's error text fit for the user: secrets and URL userinfo withheld.

    Besides what the one redactor withholds (shapes, signed-URL parameters, the
    values of secret-named variables), the secrets the providers' standard
    chains read from files (:func:`chain_secrets`) are withheld wherever they
    occur: a provider or proxy may echo any of them.
    """
    import re

    from manifest.redact import redact_text, redact_urls

    message = re.sub(r"(?<=://)[^/@\s]+@", "", message)  # a custom endpoint's userinfo
    message = redact_urls(message)  # a presigned URL's signature, a password with a '/'
    env = dict(os.environ)
    env.update({f"CHAIN_SECRET_{i}": value for i, value in enumerate(chain_secrets())})
    return redact_text(message, env=env)


_SECRET_FIELDS = ("private_key", "private_key_id", "client_secret", "refresh_token",
                  "aws_secret_access_key", "aws_session_token", "aws_access_key_id")


def chain_secrets() -> list[str]:
    """Secret values in the files the standard chains read (never recorded, only withheld).

    Google's ``GOOGLE_APPLICATION_CREDENTIALS`` file and the gcloud ADC file
    (``private_key``, its id, ``client_secret``, ``refresh_token``; each line of a
    PEM key too), boto3's shared credentials file (``AWS_SHARED_CREDENTIALS_FILE``
    or ``~/.aws/credentials``), huggingface_hub's token file. Read through the
    bounded reader (regular files, 64 KiB at most); anything unreadable is skipped.
    """
    import json
    from pathlib import Path

    from manifest.bounded import InputKind, read_user_file_if_exists
    from manifest.errors import ManifestError

    home = Path.home()
    gcloud = Path(os.environ.get("CLOUDSDK_CONFIG") or home / ".config" / "gcloud")
    hf_home = Path(os.environ.get("HF_HOME") or home / ".cache" / "huggingface")
    files = [os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or "",
             str(gcloud / "application_default_credentials.json"),
             os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or str(home / ".aws" / "credentials"),
             os.environ.get("HF_TOKEN_PATH") or str(hf_home / "token")]
    values: list[str] = []
    for name in files:
        if not name:
            continue
        try:
            raw = read_user_file_if_exists(name, InputKind.KEY)
        except (ManifestError, OSError):
            continue
        if not raw:
            continue
        text = raw.decode("utf-8", "replace")
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            found = [str(doc[k]) for k in _SECRET_FIELDS if isinstance(doc.get(k), str)]
        elif name.endswith("token"):
            found = [text.strip()]
        else:  # an INI file: key = value
            found = [line.partition("=")[2].strip() for line in text.splitlines()
                     if line.partition("=")[0].strip().lower() in _SECRET_FIELDS]
        for value in found:
            values.append(value)
            values.extend(line.strip() for line in value.splitlines()
                          if len(line.strip()) >= 16 and "-----" not in line)
    return [v for v in values if len(v) >= 6]


_ENDPOINT_VARS = {
    "s3": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "gcs": ("STORAGE_EMULATOR_HOST",),
    "hf": ("HF_ENDPOINT",),
    "delta": (),  # a local or mounted folder: no service
}


def endpoint_for(provider: str) -> str | None:
    """Today's endpoint for ``provider`` from its standard variables (None: the default)."""
    for var in _ENDPOINT_VARS[provider]:
        value = os.environ.get(var)
        if value:
            if "://" not in value:
                value = "http://" + value  # STORAGE_EMULATOR_HOST may be host:port
            return value
    return None
