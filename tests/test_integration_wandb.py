"""W&B integration against the real library in offline mode, read back from the run directory."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import load_manifest

wandb = pytest.importorskip("wandb")

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


def offline_records(path: Path) -> Iterator[Any]:
    """The protobuf records of an offline run's ``run-*.wandb`` transaction log.

    The file is a 7-byte W&B header, then LevelDB's log format: 32 KiB blocks of
    (crc32c, little-endian length, kind) framed chunks; kind 1 is a whole record,
    2/3/4 the first/middle/last piece of one.
    """
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a chunk header
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending + data)
            pending = b""
            yield record
        elif kind in (2, 3):
            pending += data


def test_offline_run_carries_the_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    from manifest.integrations.wandb import artifact_name, log_manifest

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    manifest = load_manifest(GOLDEN.read_bytes())
    run = wandb.init(project="manifest-test", dir=str(tmp_path))
    tags = log_manifest(GOLDEN, verdict="differs")
    run.finish()
    wandb.teardown()  # the service writes the log asynchronously: wait until it has exited
    assert tags["manifest.verdict"] == "differs"
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    # Everything `wandb sync` would upload is in the run's transaction log.
    records = list(offline_records(next(run_dirs[0].glob("run-*.wandb"))))
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds[0] == "header"
    summary = {i.key: json.loads(i.value_json) for r in records
               if r.WhichOneof("record_type") == "summary" for i in r.summary.update}
    assert summary["manifest.run_id"] == manifest.run_id
    assert summary["manifest.digest"] == manifest.digest
    assert summary["manifest.verdict"] == "differs"
    config = {i.key: json.loads(i.value_json) for r in records
              if r.WhichOneof("record_type") == "config" for i in r.config.update}
    assert config["manifest.run_id"] == manifest.run_id
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert [(a.name, a.type) for a in artifacts] == [(artifact_name(manifest.run_id),
                                                      "manifest")]
    assert [c.path for c in artifacts[0].manifest.contents] == ["manifest.json"]
    metadata = json.loads(artifacts[0].metadata)
    assert metadata["manifest.run_id"] == manifest.run_id
