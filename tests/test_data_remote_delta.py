"""Delta Lake tables written by deltalake itself, pinned from their log, then vacuumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from manifest.data.digest import digest_path
from manifest.data.remote import pin_dataset, recheck
from manifest.data.remote.pins import parse_pins, pins_root
from manifest.data.remote.url import parse_url
from manifest.errors import DataError
from manifest.store import BlobStore
from tests.runs import make_repo, manifest_cli

pytest.importorskip("deltalake")


def _rows(start: int, n: int = 3, part: str | None = None) -> Any:
    import arro3.core as arrow

    columns: dict[str, Any] = {
        "x": arrow.Array(list(range(start, start + n)), arrow.DataType.int64()),
        "y": arrow.Array([f"row {i}" for i in range(start, start + n)], arrow.DataType.string()),
    }
    if part is not None:
        columns["p"] = arrow.Array([part] * n, arrow.DataType.string())
    return arrow.Table.from_pydict(columns)


def _write(table: Path, rows: Any, mode: str = "append", **kwargs: Any) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(table), rows, mode=mode, **kwargs)  # type: ignore[call-overload]


def _files(table: Path, version: int) -> list[str]:
    from deltalake import DeltaTable

    return sorted(str(Path(uri).relative_to(table))
                  for uri in DeltaTable(str(table), version=version).file_uris())


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    blobs = BlobStore(tmp_path / "store")
    blobs.ensure()
    return blobs


def test_url_forms() -> None:
    assert parse_url("delta:///data/t@3").text() == "delta:///data/t@3"
    assert parse_url("delta:///data/t/").text() == "delta:///data/t"
    assert parse_url("delta:///data/a@b/t").bucket == "/data/a@b/t"  # '@' in a folder name
    for bad in ("delta://data/t", "delta:///data/t@v1", "delta:///data/../t", "delta:///a//b"):
        with pytest.raises(DataError):
            parse_url(bad)


def test_pins_from_the_log_at_a_version(tmp_path: Path, store: BlobStore) -> None:
    table = tmp_path / "table"
    _write(table, _rows(0))
    _write(table, _rows(3))
    ds = pin_dataset("t", f"delta://{table}", store=store)
    assert ds.path == f"delta://{table}"  # the latest, resolved: version 1
    assert ds.remote is not None
    assert (ds.remote.provider, ds.remote.revision) == ("delta", "1")
    assert ds.remote.strength == "version-pin"
    assert ds.remote.checksums == {"delta-stats": 2}
    assert ds.remote.versioned == 2 and ds.remote.endpoint is None
    blob = store.get(ds.remote.pins)
    assert blob is not None and pins_root(blob) == ds.root
    pins = parse_pins(blob)
    assert sorted(pins) == _files(table, 1)
    assert ds.bytes == sum((table / key).stat().st_size for key in pins)
    assert {pin.version for pin in pins.values()} == {"1"}
    assert all(len(pin.checksum or "") == 64 for pin in pins.values())
    # Version 0 is another pin: one file, another root.
    first = pin_dataset("t", f"delta://{table}@0", store=store)
    assert first.files == 1 and first.root != ds.root
    assert first.path == f"delta://{table}@0"
    assert recheck(ds, store) == [] and recheck(first, store) == []


def test_no_file_is_read_and_why_it_is_only_a_version_pin(tmp_path: Path,
                                                          store: BlobStore) -> None:
    table = tmp_path / "table"
    _write(table, _rows(0))
    before = pin_dataset("t", f"delta://{table}@0", store=store)
    # Every data file replaced by zeros of its size: nothing pinned reads a byte of them
    # (the pins are the same), which is also why the log alone proves no content.
    for key in _files(table, 0):
        path = table / key
        path.write_bytes(b"\0" * path.stat().st_size)
    assert pin_dataset("t", f"delta://{table}@0", store=store).root == before.root
    deep = pin_dataset("t", f"delta://{table}@0", store=store, mode="deep")
    assert deep.remote is not None and deep.remote.strength == "content-digest"
    assert deep.root != before.root


def test_deep_root_equals_a_local_copy_of_the_version(tmp_path: Path, store: BlobStore) -> None:
    table = tmp_path / "table"
    _write(table, _rows(0, part="a b"), partition_by=["p"])  # a folder 'p=a%20b' on disk
    _write(table, _rows(3, part="c"), partition_by=["p"])
    ds = pin_dataset("t", f"delta://{table}", store=store, mode="deep")
    mirror = tmp_path / "mirror"
    for key in _files(table, 1):
        (mirror / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(table / key, mirror / key)
    assert any(key.startswith("p=a%20b/") for key in _files(table, 1))
    local = digest_path(mirror, cache=None)
    assert ds.root == local.root
    assert store.get(ds.listing or "") == local.listing


def test_vacuum_after_an_overwrite_names_the_pinned_files(tmp_path: Path,
                                                          store: BlobStore) -> None:
    from deltalake import DeltaTable

    table = tmp_path / "table"
    _write(table, _rows(0))
    _write(table, _rows(3))
    ds = pin_dataset("t", f"delta://{table}@1", store=store)
    pinned = _files(table, 1)
    _write(table, _rows(100), mode="overwrite")  # version 2 removes version 1's files
    assert recheck(ds, store) == []  # removed from the table, still on disk: readable
    vacuumed = DeltaTable(str(table)).vacuum(retention_hours=0, dry_run=False,
                                             enforce_retention_duration=False)
    assert sorted(vacuumed) == pinned
    lines = recheck(ds, store)
    assert lines == [f"gone: {key} (version 1 lists it; the file is no longer in the table's "
                     "folder (vacuumed or deleted))" for key in pinned]
    # The log still holds version 1 (vacuum deletes files, not commits); pinning it
    # again is refused in one sentence.
    assert len(DeltaTable(str(table), version=1).file_uris()) == 2
    with pytest.raises(DataError, match=r"^cannot pin version 1 of delta://.*: it lists "
                                        r"part-.*, and the file is no longer in the table's"):
        pin_dataset("t", f"delta://{table}@1", store=store)


def test_latest_moved_on_is_named_only_when_the_url_names_no_version(
        tmp_path: Path, store: BlobStore) -> None:
    table = tmp_path / "table"
    _write(table, _rows(0))
    latest = pin_dataset("t", f"delta://{table}", store=store)
    fixed = pin_dataset("t", f"delta://{table}@0", store=store)
    assert latest.root == fixed.root
    _write(table, _rows(3))
    assert recheck(latest, store) == [
        "the table's latest version is now 1, the run used 0 (the URL names no version: "
        "a re-run reads the latest)."]
    assert recheck(fixed, store) == []


def test_errors_are_one_sentence(tmp_path: Path, store: BlobStore) -> None:
    with pytest.raises(DataError, match=r"^cannot read delta://.*/none: no Delta table at"):
        pin_dataset("t", f"delta://{tmp_path}/none", store=store)
    table = tmp_path / "table"
    _write(table, _rows(0))
    with pytest.raises(DataError, match=r"version 5 of the table was never written "
                                        r"\(the latest is 0\)\.$"):
        pin_dataset("t", f"delta://{table}@5", store=store)


def test_capture_show_diff_verify(tmp_path: Path) -> None:
    table = tmp_path / "table"
    _write(table, _rows(0))
    repo = make_repo(tmp_path / "repo", {"job.py": "print('ok')\n"}, example=False)
    runs = []
    for version in (0, 1):
        if version:
            _write(table, _rows(3))
        proc = manifest_cli("capture", "--data", f"rows=delta://{table}@{version}", "--",
                            "python", "job.py", cwd=repo)
        assert proc.returncode == 0, proc.stderr.decode()
        (repo / f"v{version}.json").write_bytes(proc.stdout)
        runs.append(json.loads(proc.stdout))
    assert runs[0]["data"][0]["remote"]["revision"] == "0"
    wide = {"COLUMNS": "300"}
    shown = manifest_cli("show", "v0.json", cwd=repo, env=wide)
    assert "version pin (listing; 1 delta-stats; 1 versioned" in shown.stdout.decode()
    diff = manifest_cli("diff", "v0.json", "v1.json", cwd=repo, env=wide)
    assert "dataset rows revision (Hub commit, Delta version) 0 → 1" in diff.stdout.decode()
    assert manifest_cli("verify", "--no-rerun", "v1.json", cwd=repo).returncode == 0
    ok = manifest_cli("verify", "--json", "v1.json", cwd=repo)
    # The data checks out; the job writes nothing and trains nothing, so the re-run has
    # nothing to compare, and says so (issue 32) rather than "identical".
    assert ok.returncode == 3, ok.stderr.decode()
    assert json.loads(ok.stdout)["verdict"] == "nothing-compared"
    assert json.loads(ok.stdout)["data"] == []

    from deltalake import DeltaTable

    _write(table, _rows(9), mode="overwrite")
    DeltaTable(str(table)).vacuum(retention_hours=0, dry_run=False,
                                  enforce_retention_duration=False)
    strict = manifest_cli("verify", "--strict", "--json", "v1.json", cwd=repo)
    # Changed data is differs in every mode (issue 32); --strict only refuses to re-run.
    assert strict.returncode == 1, strict.stderr.decode()
    assert json.loads(strict.stdout)["verdict"] == "differs"
    [change] = json.loads(strict.stdout)["data"]
    assert len(change["files"]) == 2
    assert all(line.startswith("gone: part-") for line in change["files"])


def test_a_rerun_reads_the_table_where_it_lies(tmp_path: Path) -> None:
    """A Delta table is pinned like remote data but read from a local folder: the plan lists
    it as an input and a confined re-run sees it read-only (under /tmp, as here, bubblewrap's
    private /tmp would otherwise hide it)."""
    table = tmp_path / "table"
    _write(table, _rows(0))
    job = ("import os, pathlib, sys\n"
           "n = len(os.listdir(os.path.join(sys.argv[1], '_delta_log')))\n"
           "pathlib.Path('out').mkdir(exist_ok=True)\n"
           "pathlib.Path('out/w.bin').write_bytes(bytes([n]))\n")
    repo = make_repo(tmp_path / "repo", {"job.py": job}, example=False)
    proc = manifest_cli("capture", "--artifact", "out/*.bin", "--data",
                        f"rows=delta://{table}@0", "--", "python", "job.py", str(table),
                        cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    (repo / "run.json").write_bytes(proc.stdout)
    shown = manifest_cli("show", "run.json", cwd=repo, env={"COLUMNS": "300"})
    assert "; version 0)" in shown.stdout.decode()
    ok = manifest_cli("verify", "--json", "run.json", cwd=repo)
    assert ok.returncode == 0, ok.stderr.decode()
    report = json.loads(ok.stdout)
    assert report["verdict"] == "identical"
    assert [i["path"] for i in report["plan"]["inputs"]] == [str(table)]
