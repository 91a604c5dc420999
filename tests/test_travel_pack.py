"""``manifest pack``: a run in one file that verifies on a fresh clone (issue 12).

Every bad pack is refused with one sentence and exit 2, before anything is
written: the cases are a table (name → how the good pack is spoiled), and each
spoiled pack is first shown to be readable by plain ``zipfile`` (the positive
control: the refusal is ours, not the ZIP reader's), except the truncated one.
"""

from __future__ import annotations

import io
import json
import shutil
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest

from manifest.travel.pack import MANIFEST_ENTRY, PackError, read_pack
from tests.runs import make_repo, manifest_cli
from tests.travel import capture_run, clone, dirty_repo, entries_of, other_machine, rezip

Entries = list[tuple[zipfile.ZipInfo | str, bytes]]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    repo = dirty_repo(tmp_path_factory.mktemp("pack") / "repo")
    capture_run(repo, "--pack", "run.mfpack")
    return repo, (repo / "run.mfpack").read_bytes()


def test_pack_holds_the_manifest_and_every_blob_it_names(packed: tuple[Path, bytes]) -> None:
    repo, data = packed
    pack = read_pack(data)
    doc = json.loads(pack.manifest)
    assert pack.manifest == (repo / "run.json").read_bytes()
    assert set(pack.blobs) == {doc["code"]["diff_digest"], doc["data"][0]["listing"]}
    assert doc["code"]["dirty"] is True
    # `manifest pack` of the written manifest gives the same bytes as capture --pack.
    proc = manifest_cli("pack", "run.json", "-o", "again.mfpack", cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    assert (repo / "again.mfpack").read_bytes() == data


def test_show_and_diff_read_a_pack(packed: tuple[Path, bytes]) -> None:
    repo, _ = packed
    show = manifest_cli("show", "run.mfpack", cwd=repo)
    assert show.returncode == 0, show.stderr.decode()
    assert b"run_id" in show.stdout
    diff = manifest_cli("diff", "run.mfpack", "run.json", cwd=repo)
    assert diff.returncode == 0, diff.stderr.decode()


def _blob_names(entries: Entries) -> list[str]:
    return [str(n) for n, _ in entries if str(n).startswith("blobs/")]


def _altered_blob(entries: Entries) -> Entries:
    name = _blob_names(entries)[0]
    return [(n, b + b"tail" if n == name else b) for n, b in entries]


def _missing_blob(entries: Entries) -> Entries:
    name = _blob_names(entries)[0]
    return [(n, b) for n, b in entries if n != name]


def _traversal(entries: Entries) -> Entries:
    return [*entries, ("../x", b"outside")]


def _absolute(entries: Entries) -> Entries:
    return [*entries, ("/tmp/x", b"outside")]


def _symlink(entries: Entries) -> Entries:
    data = b"/etc/passwd"
    name = "blobs/blake3-" + blake3.blake3(data).hexdigest()
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return [*entries, (info, data)]


def _bomb(entries: Entries) -> Entries:
    data = b"\0" * (8 << 20)  # 8 MiB of zeros deflate to about 8 KiB (1000:1)
    return [*entries, ("blobs/blake3-" + blake3.blake3(data).hexdigest(), data)]


def _many_small_bombs(entries: Entries) -> Entries:
    # Each under the per-entry floor (1 MiB), together 2.7 MiB from about 3 KiB.
    extra = [bytes([i]) * (900 << 10) for i in range(3)]
    return [*entries, *(("blobs/blake3-" + blake3.blake3(d).hexdigest(), d) for d in extra)]


def _duplicate(entries: Entries) -> Entries:
    return [*entries, entries[0]]


def _extra_blob(entries: Entries) -> Entries:
    data = b"not named by the manifest"
    return [*entries, ("blobs/blake3-" + blake3.blake3(data).hexdigest(), data)]


def _no_manifest(entries: Entries) -> Entries:
    return [(n, b) for n, b in entries if n != MANIFEST_ENTRY]


def _edited_manifest(entries: Entries) -> Entries:
    return [(n, b.replace(b'"dirty":true', b'"dirty":false') if n == MANIFEST_ENTRY else b)
            for n, b in entries]


BAD: dict[str, tuple[Callable[[Entries], Entries], str]] = {
    "blob content mismatch": (_altered_blob, "does not match its content address"),
    "missing blob": (_missing_blob, "lacks the blob"),
    "path traversal": (_traversal, "unexpected entry '../x'"),
    "absolute path": (_absolute, "unexpected entry '/tmp/x'"),
    "symlink entry": (_symlink, "not a regular file"),
    "zip bomb": (_bomb, "ratio limit"),
    "many small bombs": (_many_small_bombs, "(a zip bomb?)"),
    "duplicated entry": (_duplicate, "twice"),
    "unreferenced blob": (_extra_blob, "does not reference"),
    "no manifest": (_no_manifest, "has no manifest.json"),
    "edited manifest": (_edited_manifest, "digest does not match"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_pack_is_one_sentence_and_exit_2(packed: tuple[Path, bytes], tmp_path: Path,
                                             case: str) -> None:
    _, good = packed
    spoil, expected = BAD[case]
    bad = rezip(spoil(entries_of(good)))
    with zipfile.ZipFile(io.BytesIO(bad)) as zf:
        assert zf.testzip() is None  # positive control: a ZIP reader accepts it as is
    work = tmp_path / "work"
    work.mkdir()
    (work / "bad.mfpack").write_bytes(bad)
    for verb in (["show"], ["verify", "--no-rerun"], ["diff", "bad.mfpack"]):
        proc = manifest_cli(*verb, "bad.mfpack", cwd=work)
        stderr = proc.stderr.decode()
        assert proc.returncode == 2, (verb, stderr)
        assert expected in stderr, stderr
        assert stderr.count("\n") == 1 and "Traceback" not in stderr
        assert proc.stdout == b""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bad.mfpack", "work"]


def test_truncated_pack_is_refused(packed: tuple[Path, bytes], tmp_path: Path) -> None:
    _, good = packed
    assert read_pack(good).manifest  # positive control: the whole pack reads
    for cut in (len(good) // 2, len(good) - 10):
        (tmp_path / "cut.mfpack").write_bytes(good[:cut])
        with pytest.raises(PackError, match="truncated or corrupt"):
            read_pack(good[:cut])
        proc = manifest_cli("show", "cut.mfpack", cwd=tmp_path)
        assert proc.returncode == 2
        assert "truncated or corrupt" in proc.stderr.decode()


def test_pack_refuses_a_store_without_the_blobs(packed: tuple[Path, bytes],
                                               tmp_path: Path) -> None:
    repo, _ = packed
    shutil.copy(repo / "run.json", tmp_path / "run.json")
    proc = manifest_cli("pack", "run.json", "-o", "run.mfpack", cwd=tmp_path)
    assert proc.returncode == 2
    assert "missing from the store" in proc.stderr.decode()
    assert not (tmp_path / "run.mfpack").exists()


@pytest.mark.slow
def test_pack_of_a_dirty_run_verifies_identical_on_a_fresh_clone(tmp_path: Path) -> None:
    """The issue's scenario on the bundled example (real CPU training, dirty tree): no
    file but the pack travels to a clone on another path, verified by another machine."""
    origin = make_repo(tmp_path / "origin", {"corpus/a.txt": "alpha\n"})
    (origin / "train.py").write_text((origin / "train.py").read_text() + "# uncommitted\n")
    (origin / "notes.txt").write_text("untracked\n")
    proc = manifest_cli("capture", "-q", "--seed", "3", "--data", "corpus", "--artifact",
                        "out/*.safetensors", "--pack", "run.mfpack", "--", "python", "train.py",
                        "--steps", "8", cwd=origin, env=other_machine(tmp_path / "near"))
    assert proc.returncode == 0, proc.stderr.decode()
    (origin / "run.json").write_bytes(proc.stdout)
    assert json.loads(proc.stdout)["code"]["dirty"] is True
    elsewhere = clone(origin, tmp_path / "far" / "away" / "clone")
    shutil.copy(origin / "run.mfpack", elsewhere / "run.mfpack")
    far = other_machine(tmp_path / "far")
    # Positive control: the bare manifest cannot be rebuilt there (its patch is missing).
    shutil.copy(origin / "run.json", elsewhere / "plain.json")
    plain = manifest_cli("verify", "plain.json", "--trust", cwd=elsewhere, env=far)
    assert plain.returncode == 3
    assert "missing from the store" in plain.stderr.decode()
    # The pack still needs consent there: it was not sealed on that machine.
    refused = manifest_cli("verify", "run.mfpack", cwd=elsewhere, env=far)
    assert refused.returncode == 2
    assert "--trust" in refused.stderr.decode()
    proc = manifest_cli("verify", "run.mfpack", "--trust", "--json", cwd=elsewhere, env=far)
    assert proc.returncode == 0, proc.stderr.decode()
    report = json.loads(proc.stdout)
    assert report["verdict"] == "identical"
    assert report["data"] == [] and report["drift"] == []
    assert [a["identical"] for a in report["artifacts"]] == [True]
    # The pack's blobs were read, not copied into the clone's store.
    patch = json.loads((origin / "run.json").read_bytes())["code"]["diff_digest"]
    assert not (elsewhere / ".manifest" / "blobs" / patch.replace(":", "-")).exists()


def test_gate_reads_a_pack_like_its_manifest(packed: tuple[Path, bytes]) -> None:
    repo, good = packed
    (repo / "pyproject.toml").write_text('[tool.manifest]\nthreads = 1\n'
                                         'command = ["python", "writer.py"]\n')
    try:
        lines = {}
        for name in ("run.json", "run.mfpack"):
            proc = manifest_cli("gate", "--no-rerun", name, cwd=repo)
            text = proc.stdout.decode() + proc.stderr.decode()
            lines[name] = [ln for ln in text.splitlines() if " manifests " in ln]
            assert proc.returncode in (0, 1), text  # hygiene may fail: no lockfile here
        assert lines["run.json"] == lines["run.mfpack"]
        assert "1 manifest(s) intact" in lines["run.mfpack"][0]
        (repo / "bad.mfpack").write_bytes(rezip(_altered_blob(entries_of(good))))
        proc = manifest_cli("gate", "--no-rerun", "bad.mfpack", cwd=repo)
        assert proc.returncode == 2
        assert "does not match its content address" in proc.stderr.decode()
    finally:
        (repo / "pyproject.toml").unlink()
        (repo / "bad.mfpack").unlink(missing_ok=True)


def test_op_streams_travel_in_the_pack(packed: tuple[Path, bytes]) -> None:
    """A run captured with --fingerprint-ops names its op stream blobs: they travel too."""
    from manifest.canonical import dumps, seal
    from manifest.travel.pack import build_pack

    pack = read_pack(packed[1])
    doc = json.loads(pack.manifest)
    stream = b"op stream bytes"
    name = "blake3:" + blake3.blake3(stream).hexdigest()
    doc["outputs"]["processes"] = [{"rank": 0, "at_exit": None, "trail": [],
                                    "ops": {"digest": name, "steps": [1, 2], "ops": 7}}]
    manifest = dumps(seal(doc))
    again = read_pack(build_pack(manifest, {**pack.blobs, name: stream}))
    assert again.blobs[name] == stream
    with pytest.raises(PackError, match="is not available"):
        build_pack(manifest, pack.blobs)
