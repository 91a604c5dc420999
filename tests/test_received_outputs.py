"""A run received without its outputs, and the two ways its weights travel to a verifier.

``pack --with-outputs`` carries the declared output files (content-addressed, held to the
pack's rules) and ``verify --outputs DIR`` names a folder where they are (each checked
against its recorded digest, or tensor table, before use). Without either, a received run
whose step trails lie inside the envelope is no verdict (exit 3) with the reason, never
``differs``; and a file that was never on this machine is never "changed since capture".
The parts run without training; one slow test runs the case end to end through the CLI.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import blake3
import pytest
import torch
from safetensors.torch import save_file

from manifest.travel.pack import PackError, build_pack, read_pack
from manifest.verify.equivalence import (
    DID_NOT_TRAVEL,
    RECEIVED,
    locate_recorded,
    output_distance,
)
from manifest.weights.compare import compare_artifacts
from manifest.weights.tables import digest_artifact
from tests.runs import make_repo, manifest_cli
from tests.travel import capture_run, clone, dirty_repo, entries_of, other_machine, rezip


@pytest.fixture(scope="module")
def writer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The writer script's run (a 16 KiB output file, no torch), its manifest run.json."""
    repo = dirty_repo(tmp_path_factory.mktemp("received") / "repo")
    capture_run(repo)
    return repo


def _pack(repo: Path, *extra: str, env: dict[str, str] | None = None,
          name: str = "with.mfpack") -> tuple[int, str]:
    proc = manifest_cli("pack", "run.json", "-o", name, *extra, cwd=repo, env=env)
    return proc.returncode, proc.stderr.decode()


def test_a_pack_with_outputs_carries_the_declared_files(writer_run: Path) -> None:
    code, stderr = _pack(writer_run, "--with-outputs")
    assert code == 0, stderr
    pack = read_pack((writer_run / "with.mfpack").read_bytes())
    [artifact] = json.loads(pack.manifest)["outputs"]["artifacts"]
    assert pack.outputs == {artifact["digest"]: (writer_run / "out/model.bin").read_bytes()}
    # without the flag the pack is what it was: no outputs
    code, stderr = _pack(writer_run, name="plain.mfpack")
    assert code == 0, stderr
    assert read_pack((writer_run / "plain.mfpack").read_bytes()).outputs == {}
    # show and verify --no-rerun read a pack with outputs like any other
    for verb in (["show"], ["verify", "--no-rerun"]):
        proc = manifest_cli(*verb, "with.mfpack", cwd=writer_run)
        assert proc.returncode == 0, proc.stderr.decode()
    # a signed pack keeps them (the signature is written into the pack)
    pytest.importorskip("cryptography")
    from tests.travel import write_keys

    private, _ = write_keys(writer_run.parent / "keys", "signer")
    proc = manifest_cli("sign", "with.mfpack", "--key", str(private), cwd=writer_run)
    assert proc.returncode == 0, proc.stderr.decode()
    signed = read_pack((writer_run / "with.mfpack").read_bytes())
    assert signed.signature is not None and signed.outputs == pack.outputs


def _output_entry(entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> str:
    return next(str(n) for n, _ in entries if str(n).startswith("outputs/"))


def test_a_packed_output_is_held_to_the_packs_rules(writer_run: Path) -> None:
    code, stderr = _pack(writer_run, "--with-outputs")
    assert code == 0, stderr
    good = (writer_run / "with.mfpack").read_bytes()
    assert read_pack(good).outputs  # positive control: the pack as written reads
    entries = entries_of(good)
    name = _output_entry(entries)
    stranger = b"weights nobody declared"
    cases = {
        "altered": ([(n, b + b"x" if n == name else b) for n, b in entries],
                    "does not match its content address: the output was altered"),
        "undeclared": ([*entries, ("outputs/blake3-" + blake3.blake3(stranger).hexdigest(),
                                   stranger)], "that its manifest does not declare"),
        "not a blob": ([*entries, ("outputs/model.bin", b"x")], "unexpected entry"),
    }
    for case, (spoiled, expected) in cases.items():
        bad = rezip(spoiled)
        with zipfile.ZipFile(io.BytesIO(bad)) as zf:
            assert zf.testzip() is None, case  # a ZIP reader takes it as it is
        with pytest.raises(PackError, match=expected):
            read_pack(bad)
    # the writer takes only outputs the manifest declares, by their content
    kept = read_pack(good)
    with pytest.raises(PackError, match="not one of the manifest's single-file outputs"):
        build_pack(kept.manifest, kept.blobs,
                   outputs={"blake3:" + blake3.blake3(stranger).hexdigest(): stranger})


def test_pack_refuses_outputs_it_cannot_vouch_for(writer_run: Path, tmp_path: Path) -> None:
    output = writer_run / "out" / "model.bin"
    original = output.read_bytes()
    try:
        output.write_bytes(original[::-1])  # same size, other bytes
        code, stderr = _pack(writer_run, "--with-outputs")
        assert code == 2 and "changed since capture" in stderr, stderr
        assert stderr.count("\n") == 1 and "Traceback" not in stderr
        output.unlink()
        code, stderr = _pack(writer_run, "--with-outputs")
        assert code == 2 and "cannot pack the output out/model.bin" in stderr, stderr
        # a link out of the tree, to a file with the recorded bytes, is not followed
        (tmp_path / "model.bin").write_bytes(original)
        output.symlink_to(tmp_path / "model.bin")
        code, stderr = _pack(writer_run, "--with-outputs")
        assert code == 2 and "link out of" in stderr, stderr
        output.unlink()
        output.write_bytes(original)
        # a cap the manifest fits under and the manifest with its output does not
        cap = str(len((writer_run / "run.json").read_bytes()) + len(original) // 2)
        code, stderr = _pack(writer_run, "--with-outputs", env={"MANIFEST_MAX_BYTES": cap})
        assert code == 2 and "over the" in stderr and "--outputs DIR" in stderr, stderr
        code, stderr = _pack(writer_run, "--with-outputs")  # positive control
        assert code == 0, stderr
    finally:
        if output.is_symlink() or not output.exists():
            output.unlink(missing_ok=True)
            output.write_bytes(original)


def _weights(path: Path, shift: float = 0.0, metadata: dict[str, str] | None = None) -> None:
    gen = torch.Generator().manual_seed(5)
    save_file({"w": torch.randn(16, 8, generator=gen) + shift,
               "b": torch.randn(16, generator=gen)}, str(path), metadata=metadata)


def test_where_the_recorded_file_is(tmp_path: Path) -> None:
    tree, supplied, scratch = tmp_path / "tree", tmp_path / "received", tmp_path / "scratch"
    for folder in (tree / "out", supplied, scratch):
        folder.mkdir(parents=True)
    _weights(tree / "out" / "model.safetensors")
    art = digest_artifact(tree / "out" / "model.safetensors", "out/model.safetensors")
    kept = (tree / "out" / "model.safetensors").read_bytes()
    # the user's tree, as on the capturing machine
    held = locate_recorded([art], tree_cwd=tree)[art.path]
    assert (held.source, held.path) == ("tree", tree / "out" / "model.safetensors")
    # nothing anywhere: absent, and said so as such
    held = locate_recorded([art], tree_cwd=tmp_path / "clone")[art.path]
    assert held.source == "absent" and not held.travelled and held.path is None
    assert held.problem is not None and "not on this machine" in held.problem
    # a pack's bytes are written into the scratch directory only
    held = locate_recorded([art], tree_cwd=tmp_path / "clone", packed={art.digest: kept},
                           scratch=scratch)[art.path]
    assert held.source == "pack" and held.path is not None
    assert held.path.parent == scratch / RECEIVED and held.path.read_bytes() == kept
    # --outputs DIR: by file name, checked
    shutil.copy(tree / "out" / "model.safetensors", supplied / "model.safetensors")
    held = locate_recorded([art], tree_cwd=tree, outputs_dir=supplied)[art.path]
    assert (held.source, held.path, held.note) == (
        "outputs", supplied / "model.safetensors", None)
    # re-saved with other bytes but the same tensors: used, and said
    _weights(supplied / "model.safetensors", metadata={"saved": "again"})
    assert (supplied / "model.safetensors").read_bytes() != kept
    held = locate_recorded([art], tree_cwd=tree, outputs_dir=supplied)[art.path]
    assert held.source == "outputs" and held.note is not None and "every tensor" in held.note
    # other weights under its name: a mismatch, named with the tensor
    _weights(supplied / "model.safetensors", shift=0.5)
    held = locate_recorded([art], tree_cwd=tree, outputs_dir=supplied)[art.path]
    assert held.source == "mismatch" and held.path is None and held.problem is not None
    assert "is not the recorded out/model.safetensors" in held.problem
    assert "tensor w differs" in held.problem
    # a FIFO under its name is refused in a sentence, never waited on
    (supplied / "model.safetensors").unlink()
    os.mkfifo(supplied / "model.safetensors")
    held = locate_recorded([art], tree_cwd=tree, outputs_dir=supplied)[art.path]
    assert held.source == "mismatch" and "cannot be used" in str(held.problem)
    # not in DIR at all: absent, naming where it was looked for
    (supplied / "model.safetensors").unlink()
    held = locate_recorded([art], tree_cwd=tree, outputs_dir=supplied)[art.path]
    assert held.source == "absent" and str(supplied / "out/model.safetensors") in str(
        held.problem)


def test_missing_is_not_changed(tmp_path: Path) -> None:
    """A recorded file that is not here is named as such; one that changed, as changed."""
    _weights(tmp_path / "a.safetensors")
    _weights(tmp_path / "b.safetensors", shift=0.25)
    recorded = digest_artifact(tmp_path / "a.safetensors", "out/model.safetensors")
    again = digest_artifact(tmp_path / "b.safetensors", "out/model.safetensors")
    absent = compare_artifacts(recorded, again, recorded_file=tmp_path / "gone.safetensors",
                               new_file=tmp_path / "b.safetensors")
    assert absent.detail is not None and "not on this machine" in absent.detail
    assert "changed since capture" not in absent.detail
    changed = compare_artifacts(recorded, again, recorded_file=tmp_path / "b.safetensors",
                                new_file=tmp_path / "b.safetensors")
    assert changed.detail is not None and "changed since capture" in changed.detail
    here = compare_artifacts(recorded, again, recorded_file=tmp_path / "a.safetensors",
                             new_file=tmp_path / "b.safetensors")
    assert here.detail is None and all(t.max_abs for t in here.tensors if t.name == "w")
    gone = output_distance(recorded, None, tmp_path / "b.safetensors")
    assert not gone.travelled and gone.problem is not None
    assert output_distance(recorded, tmp_path / "a.safetensors",
                           tmp_path / "b.safetensors").travelled


@pytest.mark.slow
def test_a_received_run_is_no_verdict_until_its_outputs_come(tmp_path: Path) -> None:
    """The bundled example captured at 2 threads with its envelope, received as a pack in
    a fresh clone and re-run at 3 threads (rounding only): without the outputs no verdict;
    with them (a folder, or inside the pack) equivalent."""
    origin = make_repo(tmp_path / "origin", {})
    machine = other_machine(tmp_path / "machine")  # one seal record: the envelope decides
    proc = manifest_cli("capture", "-q", "--threads", "2", "--envelope", "2", "--artifact",
                        "out/*.safetensors", "--", "python", "train.py", "--steps", "6",
                        cwd=origin, env=machine, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    (origin / "run.json").write_bytes(proc.stdout)
    for extra, name in (((), "run.mfpack"), (("--with-outputs",), "full.mfpack")):
        packed = manifest_cli("pack", "run.json", "-o", name, *extra, cwd=origin, env=machine)
        assert packed.returncode == 0, packed.stderr.decode()
    elsewhere = clone(origin, tmp_path / "far" / "clone")
    for name in ("run.mfpack", "full.mfpack"):
        shutil.copy(origin / name, elsewhere / name)

    def verify(*args: str) -> tuple[int, dict[str, Any]]:
        run = manifest_cli("verify", *args, "--threads", "3", "--json", cwd=elsewhere,
                           env=machine, timeout=600)
        assert run.stdout, run.stderr.decode()[-2000:]
        return run.returncode, json.loads(run.stdout)

    code, report = verify("run.mfpack")
    assert (code, report["verdict"]) == (3, "no-verdict"), report["reason"]
    assert DID_NOT_TRAVEL in str(report["reason"])
    text = json.dumps(report)
    assert "changed since capture" not in text and "not on this machine" in text
    code, report = verify("run.mfpack", "--outputs", str(origin / "out"))
    assert (code, report["verdict"]) == (4, "equivalent"), report["reason"]
    assert any("(--outputs)" in n for n in report["notes"])
    code, report = verify("full.mfpack")
    assert (code, report["verdict"]) == (4, "equivalent"), report["reason"]
    assert any("carried by the pack" in n for n in report["notes"])
    assert not (elsewhere / "out").exists()  # nothing was written next to the user's files


def test_outputs_flag_is_checked_before_anything_runs(writer_run: Path) -> None:
    proc = manifest_cli("verify", "run.json", "--outputs", "nowhere", cwd=writer_run)
    assert proc.returncode == 2 and "--outputs nowhere: no such folder" in proc.stderr.decode()
    proc = manifest_cli("verify", "run.json", "--no-rerun", "--outputs", "out", cwd=writer_run)
    assert proc.returncode == 2 and "--no-rerun compares none" in proc.stderr.decode()

