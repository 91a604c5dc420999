"""GCS pins against gcp-storage-emulator, started by the test on 127.0.0.1.

The error sentences are checked against the emulator where it can produce the
failure: a bucket that does not exist (its 404 on ``objects.list``), a prefix
with no object under it, an object overwritten or deleted since it was pinned.
It cannot produce the others, so they are checked on the exception the client
raises (``test_sentences_the_emulator_cannot_produce``): the emulator accepts
any request, with or without credentials (no 401 or 403: access denied is
never answered), never throttles (no 429), and the client skips Application
Default Credentials when ``STORAGE_EMULATOR_HOST`` is set (no
DefaultCredentialsError). Nor does it keep generations: it answers a read of
any ``generation`` with the current object, so "the pinned version is still
readable" after an overwrite is the emulator's answer, where real GCS (without
object versioning) answers 404 and the line says the pinned version is gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from manifest.data.remote import pin_dataset, recheck
from manifest.data.remote.pins import parse_pins
from manifest.errors import DataError
from manifest.store import BlobStore
from tests.runs import free_port

# ray's extra brings grpcio without grpcio-status; google-api-core warns about it on import.
pytestmark = pytest.mark.filterwarnings("ignore:Please install grpcio-status:ImportWarning")


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="gcs-data")
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def test_gcs_pins_generation_and_crc32c(emulator: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    client = storage.Client(project="t", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    bucket = client.bucket("gcs-data")
    for name, body in (("d/a.bin", b"alpha"), ("d/sub/b.bin", b"bravo"), ("e/x", b"x")):
        bucket.blob(name).upload_from_string(body)
    store = BlobStore(tmp_path / "store")
    store.ensure()
    ds = pin_dataset("d", "gs://gcs-data/d", store=store)
    assert ds.files == 2 and ds.bytes == 10
    assert ds.remote is not None and ds.remote.strength == "content-digest"
    blob = store.get(ds.remote.pins)
    assert blob is not None
    pins = parse_pins(blob)
    assert list(pins) == ["a.bin", "sub/b.bin"]
    assert all(p.version for p in pins.values())
    assert recheck(ds, store) == []
    bucket.blob("d/a.bin").upload_from_string(b"changed")
    [line] = recheck(ds, store)
    assert line.startswith("changed: a.bin (version ")
    with pytest.raises(DataError, match="no objects under gs://gcs-data/none/"):
        pin_dataset("n", "gs://gcs-data/none", store=store)


@pytest.fixture
def gcs_store(emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    store = BlobStore(tmp_path / "store")
    store.ensure()
    return store


def test_missing_bucket_and_prefix_from_the_emulator(gcs_store: BlobStore) -> None:
    with pytest.raises(DataError) as missing:
        pin_dataset("d", "gs://no-such-bucket/x", store=gcs_store)
    assert missing.value.message == ("cannot list gs://no-such-bucket/x/: bucket "
                                     "no-such-bucket does not exist.")
    with pytest.raises(DataError) as empty:
        pin_dataset("d", "gs://gcs-data/no/such/prefix", store=gcs_store)
    assert empty.value.message == "no objects under gs://gcs-data/no/such/prefix/."
    # One sentence and exit status 2 from the command line as well.
    from tests.runs import make_repo, manifest_cli

    repo = make_repo(gcs_store.root.parent / "repo", {"job.py": "pass\n"}, example=False)
    proc = manifest_cli("capture", "--data", "gs://no-such-bucket/x", "--", "python", "job.py",
                        cwd=repo)
    assert proc.returncode == 2
    assert b"cannot list gs://no-such-bucket/x/: bucket no-such-bucket does not exist." \
        in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_overwritten_generation_is_gone_from_the_emulator(gcs_store: BlobStore) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="t", credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    bucket = client.bucket("gcs-data")
    bucket.blob("g/one.bin").upload_from_string(b"first")
    ds = pin_dataset("d", "gs://gcs-data/g", store=gcs_store)
    bucket.blob("g/one.bin").upload_from_string(b"second")  # no object versioning: replaced
    [line] = recheck(ds, gcs_store)
    assert line.startswith("changed: one.bin (version ")
    assert "size 5 → 6 bytes, md5 " in line
    # The emulator ignores generation: any one reads as the current object (see above).
    assert bucket.blob("g/one.bin", generation=12345).exists()
    assert line.endswith("the pinned version is still readable)")
    bucket.blob("g/one.bin").delete()
    bucket.blob("g/two.bin").upload_from_string(b"2")
    assert recheck(ds, gcs_store) == ["removed: one.bin (the pinned version is gone)",
                                      "added: two.bin (1 bytes)"]


def test_sentences_the_emulator_cannot_produce() -> None:
    from google.api_core import exceptions as gx
    from google.auth.exceptions import DefaultCredentialsError

    from manifest.data.remote.gcs import gcs_error
    from manifest.data.remote.url import parse_url

    url = parse_url("gs://b-1/p")
    cases: list[tuple[Exception, str]] = [
        (gx.Forbidden("caller does not have storage.objects.list access"),  # type: ignore[no-untyped-call]
         "cannot list gs://b-1/p/: access denied."),
        (gx.Unauthorized("Invalid Credentials"),  # type: ignore[no-untyped-call]
         "cannot list gs://b-1/p/: access denied."),
        (gx.TooManyRequests("rate"),  # type: ignore[no-untyped-call]
         "cannot list gs://b-1/p/: GCS kept throttling after retries with backoff."),
        (DefaultCredentialsError("no ADC"),  # type: ignore[no-untyped-call]
         "cannot list gs://b-1/p/: no Google Cloud credentials were found."),
    ]
    for exc, sentence in cases:
        assert gcs_error(exc, url, "list").message == sentence
