"""GCS pins against gcp-storage-emulator, started by the test on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from manifest.data.remote import pin_dataset, recheck
from manifest.data.remote.pins import parse_pins
from manifest.errors import DataError
from manifest.store import BlobStore
from tests.runs import free_port


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
