"""End to end: a real CPU training reads its data from moto's S3 server.

capture pins the bucket from its listing (no body read by manifest), verify
re-lists it and re-runs bit-identically; read against another endpoint it says
what it did not check; an object added that the script never reads makes every
mode say ``differs``; after one object is overwritten, verify names that object
before it spends any compute, and ``--strict`` refuses to re-run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.remote_fixtures import MotoS3, moto_server_fixture, s3_fixture  # noqa: F401
from tests.runs import capture, make_repo, manifest_cli

pytestmark = pytest.mark.slow

TRAIN = '''
import os, boto3, torch
from safetensors.torch import save_file

s3 = boto3.client("s3")
rows = []
for key in ("shards/0.bin", "shards/1.bin"):
    body = s3.get_object(Bucket="e2e-data", Key=key)["Body"].read()
    rows.append(torch.frombuffer(bytearray(body), dtype=torch.uint8).float() / 255)
x = torch.stack(rows)
model = torch.nn.Linear(x.shape[1], 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    loss = (model(x + 0.01 * torch.randn_like(x)) ** 2).mean()
    loss.backward()
    opt.step()
os.makedirs("out", exist_ok=True)
save_file(dict(model.state_dict()), "out/model.safetensors")
'''


def test_capture_verify_then_overwrite(s3: MotoS3, tmp_path: Path) -> None:
    client = s3.client()
    client.create_bucket(Bucket="e2e-data")
    client.put_bucket_versioning(Bucket="e2e-data",
                                 VersioningConfiguration={"Status": "Enabled"})
    for i in range(2):
        client.put_object(Bucket="e2e-data", Key=f"shards/{i}.bin", Body=bytes(range(i, i + 64)))
    repo = make_repo(tmp_path / "repo", {"train_s3.py": TRAIN}, example=False)
    s3.log.clear()
    path, doc = capture(repo, "--data", "shards=s3://e2e-data/shards",
                        command=["python", "train_s3.py"])
    # manifest listed once; the two GETs are the training script's own reads.
    assert s3.log.object_gets("e2e-data") == 2
    [ds] = doc["data"]
    assert ds["path"] == "s3://e2e-data/shards/"
    assert ds["remote"]["strength"] == "version-pin"
    assert ds["remote"]["endpoint"] == s3.endpoint

    shown = manifest_cli("show", str(path), cwd=repo)
    assert shown.returncode == 0, shown.stderr.decode()
    assert "version pin (listing" in shown.stdout.decode()

    ok = manifest_cli("verify", "--network", "--json", str(path), cwd=repo)
    report = json.loads(ok.stdout)
    assert ok.returncode == 0, ok.stderr.decode()
    assert report["verdict"] == "identical"
    assert report["data"] == []

    # Read against another endpoint, nothing was checked: said so, not "changed".
    other = manifest_cli("verify", "--no-rerun", "--json", str(path), cwd=repo,
                         env={"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"})
    report = json.loads(other.stdout)
    assert (other.returncode, report["verdict"]) == (0, "checked"), other.stderr.decode()
    [unchecked] = report["data"]
    assert unchecked["checked"] is False
    assert "not checked" in unchecked["detail"] and "http://127.0.0.1:9" in unchecked["detail"]
    assert any("not checked" in note for note in report["notes"])

    # An object the script never reads is added under the prefix: the outputs still
    # match, but the recorded data changed, so every mode says differs (issue 32).
    client.put_object(Bucket="e2e-data", Key="shards/extra.bin", Body=b"\x01" * 8)
    for mode in (["--no-rerun"], []):
        run = manifest_cli("verify", *mode, "--network", "--json", str(path), cwd=repo)
        report = json.loads(run.stdout)
        assert (run.returncode, report["verdict"]) == (1, "differs"), run.stderr.decode()
        assert report["reason"].startswith("recorded data changed since capture: shards")
        assert report["data"][0]["files"] == ["added: extra.bin (8 bytes)"]
    assert [a["identical"] for a in report["artifacts"]] == [True]
    client.delete_object(Bucket="e2e-data", Key="shards/extra.bin")

    client.put_object(Bucket="e2e-data", Key="shards/1.bin", Body=b"\x00" * 64)
    s3.log.clear()
    strict = manifest_cli("verify", "--strict", "--network", "--json", str(path), cwd=repo)
    assert s3.log.object_gets("e2e-data") == 0  # refused before the script could read
    report = json.loads(strict.stdout)
    assert (strict.returncode, report["verdict"]) == (1, "differs"), strict.stderr.decode()
    [change] = report["data"]
    [line] = change["files"]
    assert line.startswith("changed: 1.bin (version ")
    assert line.endswith("the pinned version is still readable)")
