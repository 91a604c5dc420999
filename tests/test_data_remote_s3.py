"""S3 pins against moto's real server: metadata only, deep roots, re-checks, errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from manifest.data.datasets import digest_datasets
from manifest.data.digest import digest_path
from manifest.data.remote import pin_dataset, recheck
from manifest.data.remote.pins import parse_pins, pins_root
from manifest.errors import DataError
from manifest.store import BlobStore
from tests.remote_fixtures import MotoS3, moto_server_fixture, s3_fixture  # noqa: F401

BUCKET = "train-data"
FILES = {"a.bin": b"alpha" * 100, "sub/b.bin": b"bravo", "sub/deeper/c.txt": b"charlie\n"}


def _fill(s3: MotoS3, *, versioned: bool, checksums: bool = False) -> object:
    client = s3.client(checksums=checksums)
    client.create_bucket(Bucket=BUCKET)
    if versioned:
        client.put_bucket_versioning(Bucket=BUCKET,
                                     VersioningConfiguration={"Status": "Enabled"})
    for key, body in FILES.items():
        client.put_object(Bucket=BUCKET, Key=f"data/{key}", Body=body)
    client.put_object(Bucket=BUCKET, Key="data-old/x.bin", Body=b"not under data/")
    return client


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    blobs = BlobStore(tmp_path / "store")
    blobs.ensure()
    return blobs


def test_listing_pins_read_no_body(s3: MotoS3, store: BlobStore) -> None:
    _fill(s3, versioned=False)
    s3.log.clear()
    ds = pin_dataset("d", f"s3://{BUCKET}/data", store=store)
    assert s3.log.object_gets(BUCKET) == 0
    assert set(s3.log.methods()) == {"GET"}  # the listing pages only
    assert ds.path == f"s3://{BUCKET}/data/"
    assert (ds.files, ds.bytes) == (3, sum(map(len, FILES.values())))
    assert ds.remote is not None
    assert ds.remote.strength == "change-detector"  # unversioned, ETags only
    assert ds.remote.endpoint == s3.endpoint
    blob = store.get(ds.remote.pins)
    assert blob is not None
    assert pins_root(blob) == ds.root
    assert sorted(parse_pins(blob)) == sorted(FILES)  # data-old/ is not under data/


def test_checksums_mode_heads_each_object(s3: MotoS3, store: BlobStore) -> None:
    import hashlib

    _fill(s3, versioned=False, checksums=False)  # uploaded without any checksum
    s3.log.clear()
    ds = pin_dataset("d", f"s3://{BUCKET}/data/", store=store, mode="checksums")
    assert s3.log.object_gets(BUCKET) == 0
    assert s3.log.methods()["HEAD"] == 3
    assert ds.remote is not None
    # Real S3 adds CRC64NVME to such uploads; moto 5.2 leaves single PUTs without one,
    # so the single-part, unencrypted ETag (the MD5 of the bytes) is what is left.
    assert ds.remote.checksums == {"md5": 3}
    assert ds.remote.strength == "content-digest"
    blob = store.get(ds.remote.pins)
    assert blob is not None
    for key, pin in parse_pins(blob).items():
        assert pin.checksum == hashlib.md5(FILES[key]).hexdigest()


def test_crc64nvme_is_the_real_algorithm(s3: MotoS3, store: BlobStore) -> None:
    from awscrt import checksums

    client = s3.client()
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="k", Body=b"hello", ChecksumAlgorithm="CRC64NVME")
    ds = pin_dataset("d", f"s3://{BUCKET}", store=store, mode="checksums")
    assert ds.remote is not None and ds.remote.checksums == {"crc64nvme": 1}
    blob = store.get(ds.remote.pins)
    assert blob is not None
    [pin] = parse_pins(blob).values()
    # 64 bits: moto without awscrt silently gives a 32-bit CRC32 instead.
    assert pin.checksum == checksums.crc64nvme(b"hello").to_bytes(8, "big").hex()


def test_crc32c_is_the_real_algorithm(s3: MotoS3, store: BlobStore) -> None:
    import crc32c

    client = s3.client()
    client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key="k", Body=b"hello", ChecksumAlgorithm="CRC32C")
    ds = pin_dataset("d", f"s3://{BUCKET}", store=store, mode="checksums")
    assert ds.remote is not None and ds.remote.checksums == {"crc32c": 1}
    blob = store.get(ds.remote.pins)
    assert blob is not None
    [pin] = parse_pins(blob).values()
    assert pin.checksum == crc32c.crc32c(b"hello").to_bytes(4, "big").hex()


def test_versioned_bucket_overwrite_and_delete(s3: MotoS3, store: BlobStore) -> None:
    client = _fill(s3, versioned=True)
    client.put_object(Bucket=BUCKET, Key="data/a.bin", Body=b"overwritten")  # type: ignore[attr-defined]
    client.put_object(Bucket=BUCKET, Key="data/gone.bin", Body=b"x")  # type: ignore[attr-defined]
    client.delete_object(Bucket=BUCKET, Key="data/gone.bin")  # type: ignore[attr-defined]
    ds = pin_dataset("d", f"s3://{BUCKET}/data", store=store)
    assert ds.remote is not None
    assert ds.remote.strength == "version-pin"
    assert ds.remote.versioned == 3
    assert ds.files == 3  # the delete marker hides gone.bin
    assert ds.bytes == len(b"overwritten") + len(FILES["sub/b.bin"] + FILES["sub/deeper/c.txt"])


def test_multipart_etag_and_composite_checksum_are_not_content(s3: MotoS3,
                                                                 store: BlobStore) -> None:
    client = s3.client()
    client.create_bucket(Bucket=BUCKET)
    part = b"x" * (5 << 20)
    for key, algorithm in (("composite.bin", "CRC32C"), ("plain.bin", None)):
        extra = {"ChecksumAlgorithm": algorithm} if algorithm else {}
        upload = client.create_multipart_upload(Bucket=BUCKET, Key=key, **extra)
        parts = []
        for number in (1, 2):
            made = client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload["UploadId"],
                                      PartNumber=number, Body=part, **extra)
            entry = {"PartNumber": number, "ETag": made["ETag"]}
            if algorithm:
                entry["ChecksumCRC32C"] = made["ChecksumCRC32C"]
            parts.append(entry)
        client.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload["UploadId"],
                                         MultipartUpload={"Parts": parts})
    listed = pin_dataset("d", f"s3://{BUCKET}", store=store)
    assert listed.remote is not None
    assert listed.remote.checksums == {"etag-multipart": 2}
    assert listed.remote.strength == "change-detector"
    headed = pin_dataset("d", f"s3://{BUCKET}", store=store, mode="checksums")
    assert headed.remote is not None
    blob = store.get(headed.remote.pins)
    assert blob is not None
    kinds = {key: pin.kind for key, pin in parse_pins(blob).items()}
    assert kinds["composite.bin"] == "crc32c-composite"
    # Real S3 gives this one a full-object CRC64NVME; moto 5.2 gives none, leaving the ETag.
    assert kinds["plain.bin"] == "etag-multipart"
    assert headed.remote.strength == "change-detector"
    assert headed.root != listed.root


def test_deep_root_equals_a_local_mirror(s3: MotoS3, store: BlobStore, tmp_path: Path) -> None:
    _fill(s3, versioned=True)
    s3.log.clear()
    ds = pin_dataset("d", f"s3://{BUCKET}/data", store=store, mode="deep")
    assert s3.log.object_gets(BUCKET) == 3
    mirror = tmp_path / "mirror"
    for key, body in FILES.items():
        (mirror / key).parent.mkdir(parents=True, exist_ok=True)
        (mirror / key).write_bytes(body)
    local = digest_path(mirror, cache=None)
    assert ds.root == local.root
    assert store.get(ds.listing or "") == local.listing
    assert ds.remote is not None and ds.remote.strength == "content-digest"
    (mirror / "a.bin").write_bytes(b"other")
    assert digest_path(mirror, cache=None).root != ds.root


def test_recheck_names_each_object(s3: MotoS3, store: BlobStore) -> None:
    client = _fill(s3, versioned=True)
    ds = pin_dataset("d", f"s3://{BUCKET}/data", store=store)
    assert recheck(ds, store) == []
    client.put_object(Bucket=BUCKET, Key="data/a.bin", Body=b"new bytes")  # type: ignore[attr-defined]
    client.delete_object(Bucket=BUCKET, Key="data/sub/b.bin")  # type: ignore[attr-defined]
    client.put_object(Bucket=BUCKET, Key="data/new.bin", Body=b"n")  # type: ignore[attr-defined]
    problems = recheck(ds, store)
    assert problems[0].startswith("changed: a.bin (version ")
    assert problems[0].endswith("the pinned version is still readable)")
    assert problems[1] == "added: new.bin (1 bytes)"
    assert problems[2] == "removed: sub/b.bin (the pinned version is still readable)"
    # The pinned version of c.txt is deleted for good: the version is gone.
    blob = store.get(ds.remote.pins)  # type: ignore[union-attr]
    assert blob is not None
    pinned = parse_pins(blob)["sub/deeper/c.txt"].version
    client.delete_object(Bucket=BUCKET, Key="data/sub/deeper/c.txt",  # type: ignore[attr-defined]
                         VersionId=pinned)
    assert "removed: sub/deeper/c.txt (the pinned version is gone)" in recheck(ds, store)


def test_recheck_never_follows_the_recorded_endpoint(s3: MotoS3, store: BlobStore,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(s3, versioned=False)
    ds = pin_dataset("d", f"s3://{BUCKET}/data", store=store)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    [problem] = recheck(ds, store)
    assert f"pinned at endpoint {s3.endpoint}" in problem
    assert "today's is http://127.0.0.1:9" in problem


def test_endpoint_recorded_without_userinfo(s3: MotoS3, store: BlobStore,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(s3, versioned=False)
    host = s3.endpoint.removeprefix("http://")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://user:pw@{host}")
    ds = pin_dataset("d", f"s3://{BUCKET}/data", store=store)
    assert ds.remote is not None and ds.remote.endpoint == s3.endpoint
    text = ds.model_dump_json()
    for secret in ("user", "pw", os.environ["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in text


def test_missing_bucket_and_prefix_are_one_sentence(s3: MotoS3, store: BlobStore) -> None:
    with pytest.raises(DataError, match=r"^cannot list s3://no-such-bucket/x/: bucket "
                                        r"no-such-bucket does not exist\.$"):
        pin_dataset("d", "s3://no-such-bucket/x", store=store)
    _fill(s3, versioned=False)
    with pytest.raises(DataError, match=r"^no objects under s3://train-data/nothing/\.$"):
        pin_dataset("d", f"s3://{BUCKET}/nothing", store=store)


def test_unreachable_endpoint_is_one_sentence(store: BlobStore,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.remote_fixtures import S3_ENV

    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(DataError, match="the S3 endpoint cannot be reached"):
        pin_dataset("d", f"s3://{BUCKET}/data", store=store)


def test_access_denied_and_throttling_sentences() -> None:
    from botocore.exceptions import ClientError

    from manifest.data.remote.s3 import s3_error
    from manifest.data.remote.url import parse_url

    url = parse_url("s3://b-1/p")
    for code, words in (("AccessDenied", "access denied (AccessDenied)"),
                        ("SlowDown", "kept throttling after 8 attempts")):
        exc = ClientError({"Error": {"Code": code, "Message": "m"}}, "ListObjectVersions")
        assert words in s3_error(exc, url, "list").message


def test_digest_datasets_dispatches_urls(s3: MotoS3, store: BlobStore) -> None:
    _fill(s3, versioned=False)
    [named, plain] = digest_datasets([f"train=s3://{BUCKET}/data", f"s3://{BUCKET}/data-old"],
                                     repo_root=None, store=store, no_cache=False, quiet=True)
    assert (named.name, plain.name) == ("train", "data-old")
    assert named.path == f"s3://{BUCKET}/data/"
