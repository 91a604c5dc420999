"""Real servers for the remote-data tests, started in this process on 127.0.0.1.

S3 is moto's ``ThreadedMotoServer`` (its checksums are the real algorithms
only with ``awscrt`` and ``crc32c`` installed: the tests assert digest
lengths, so a silent fallback to CRC32 fails them). Every request the server
answers is counted by method and path, so a test can prove no object body
was read. Never the network: every endpoint is 127.0.0.1.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-never-recorded",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class RequestLog:
    """(method, path, query) of every request a WSGI app answered, and its headers
    (``headers``, ``Authorization`` and ``X-Amz-Security-Token`` included: the hostile
    suite's positive control that the planted credentials reached the server)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.requests: list[tuple[str, str, str]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        with self.lock:
            self.requests.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""),
                                  environ.get("QUERY_STRING", "")))
            self.headers.append({key[5:].replace("_", "-").lower(): str(value)
                                 for key, value in environ.items()
                                 if key.startswith("HTTP_")})
        return self.app(environ, start)

    def object_gets(self, bucket: str) -> int:
        """GETs of an object (a body read), not of the bucket (a listing)."""
        return sum(1 for method, path, _ in self.requests
                   if method == "GET" and path.strip("/").startswith(bucket + "/"))

    def methods(self) -> Counter[str]:
        return Counter(method for method, _, _ in self.requests)

    def clear(self) -> None:
        with self.lock:
            self.requests.clear()
            self.headers.clear()


class MotoS3:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        inner = self.server._server
        assert inner is not None
        self.log = RequestLog(inner.app)
        inner.app = self.log

    def client(self, *, checksums: bool = True) -> Any:
        import boto3
        from botocore.config import Config

        # when_required: upload with no checksum at all, as older SDKs and tools do.
        config = Config(request_checksum_calculation="when_supported" if checksums
                        else "when_required")
        return boto3.session.Session(
            aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1").client("s3", endpoint_url=self.endpoint, config=config)

    def reset(self) -> None:
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(  # noqa: S310 (127.0.0.1)
            f"{self.endpoint}/moto-api/reset", method="POST")).read()
        self.log.clear()


@pytest.fixture(scope="module", name="gcs_emulator")
def gcs_emulator_fixture() -> Iterator[str]:
    """gcp-storage-emulator on 127.0.0.1, in memory, with the bucket ``gcs-data``."""
    from gcp_storage_emulator.server import create_server

    from tests.runs import free_port

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="gcs-data")
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture(scope="session", name="moto_server")
def moto_server_fixture() -> Iterator[MotoS3]:
    server = MotoS3()
    yield server
    server.server.stop()


@pytest.fixture(name="s3")
def s3_fixture(moto_server: MotoS3, monkeypatch: pytest.MonkeyPatch) -> MotoS3:
    """The moto server, emptied, with the standard chain pointed at it."""
    moto_server.reset()
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_server.endpoint)
    return moto_server
