"""Input a user can hand the tool ends in exit 2 and one sentence: never a hang, never
"internal error", never a traceback.

Manifests and baselines are read by one function (``manifest.canonical.read_manifest_file``):
a FIFO given by name would block forever and ``/dev/zero`` never ends, so both
are refused by type before a byte is read; a file over ``MANIFEST_MAX_BYTES``
is refused by size. The document itself may not hold a 5000-digit integer, a
lone surrogate or a NUL where a path goes. ``[tool.manifest]`` is checked for
every verb. Positive controls show the raw operation really would hang or fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from manifest.cli import app as cli
from tests.runs import make_repo, manifest_cli

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "manifest_v1.json"


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    return code, err


def _one_sentence(err: str) -> None:
    assert err.startswith("manifest: ") and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None,
         stdin: int | None = None) -> subprocess.CompletedProcess[bytes]:
    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "manifest", *args], cwd=cwd, env=full,
                          stdin=stdin, capture_output=True, timeout=30, check=False)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    # Positive control: a plain read of the FIFO blocks until a writer comes.
    done = threading.Event()

    def plain_read() -> None:
        fifo.read_bytes()
        done.set()

    reader = threading.Thread(target=plain_read, daemon=True)
    reader.start()
    assert not done.wait(0.5)
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # release the blocked reader
    reader.join(5)
    for verb in (["show", "run.json"], ["diff", str(GOLDEN), "run.json"],
                 ["verify", "--no-rerun", "run.json"]):
        started = time.monotonic()
        proc = _run(*verb, cwd=tmp_path)
        assert proc.returncode == 2
        assert b"is a FIFO" in proc.stderr and time.monotonic() - started < 20


def test_fifo_as_gate_baseline(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"pyproject.toml": (
        '[tool.manifest]\ncommand = ["python", "-c", "pass"]\n'
        '[tool.manifest.gate]\nbaseline = "base/line.json"\n')}, example=False)
    (repo / "base").mkdir()
    os.mkfifo(repo / "base" / "line.json")
    for args in (["gate", "--no-rerun"], ["gate"]):
        proc = _run(*args, cwd=repo)
        assert proc.returncode == 2, proc.stderr
        assert b"is a FIFO" in proc.stderr


def test_devices_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(capsys, "show", "/dev/zero")
    assert code == 2 and "is a device" in err
    _one_sentence(err)


def test_size_cap_on_files_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    size = GOLDEN.stat().st_size
    assert _main(capsys, "show", str(GOLDEN))[0] == 0  # positive control
    monkeypatch.setenv("MANIFEST_MAX_BYTES", str(size - 1))
    code, err = _main(capsys, "show", str(GOLDEN))
    assert code == 2 and "limit" in err and "MANIFEST_MAX_BYTES" in err
    _one_sentence(err)
    monkeypatch.setenv("MANIFEST_MAX_BYTES", "lots")
    code, err = _main(capsys, "show", str(GOLDEN))
    assert code == 2 and "positive number" in err
    with open("/dev/zero", "rb") as zero:  # an endless stdin stops at the cap
        proc = _run("show", "-", cwd=tmp_path, env={"MANIFEST_MAX_BYTES": "100000"},
                    stdin=zero.fileno())
    assert proc.returncode == 2 and b"larger than 100000 bytes" in proc.stderr


def _golden_text() -> str:
    return GOLDEN.read_text(encoding="utf-8")


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda t: t.replace('"seed":', '"seed":' + "9" * 5000 + ',"x":', 1), "4300 digits"),
    (lambda t: t.replace('{"code":{', '{"code":{"\\ud800":1,', 1), "lone UTF-16 surrogate"),
    (lambda t: t.replace('"cwd":"', '"cwd":"a\\u0000', 1), "NUL character in command.cwd"),
    (lambda t: t.replace('"outputs":{', '"outputs":{"x\\u0000":1,', 1), "NUL character"),
    (lambda t: "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    (lambda t: t[: len(t) // 2], "not valid JSON"),
    (lambda t: t.replace('"schema":"manifest/v1"', '"schema":"manifest/v9"'), "manifest/v9"),
])
def test_crafted_documents(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: object,
                           expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(edit(_golden_text()), encoding="utf-8")  # type: ignore[operator]
    for verb in (["show"], ["diff", str(GOLDEN)], ["verify", "--no-rerun"]):
        code, err = _main(capsys, *verb, str(path))
        assert code == 2, err
        assert expected in err
        _one_sentence(err)


def test_positive_control_plain_json_takes_what_load_refuses() -> None:
    raw = _golden_text().replace('{"code":{', '{"code":{"\\ud800":1,', 1)
    doc = json.loads(raw)  # plain json accepts the lone surrogate...
    with pytest.raises(UnicodeEncodeError):
        json.dumps(doc, ensure_ascii=False).encode()  # ...which then fails whoever writes it


def test_non_canonical_file_whose_digest_covers_its_own_bytes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import blake3

    from manifest.canonical import _top_level_member

    raw = GOLDEN.read_bytes()
    # Write one string with a needless escape ("\u0061" for "a"), and re-seal by hashing
    # the file's own bytes minus the digest member: what the old fast path checked.
    at = raw.index(b'"schema":"manifest/v1"')
    crafted = raw[:at] + b'"schema":"m\\u0061nifest/v1"' + raw[at + len(b'"schema":"manifest/v1"'):]
    span = _top_level_member(crafted, b"digest")
    assert span is not None
    own = "blake3:" + blake3.blake3(crafted[: span[0]] + crafted[span[1]:]).hexdigest()
    old = crafted[span[0]:span[1]].split(b'"digest":"')[1].rstrip(b'"')
    crafted = crafted.replace(old, own.encode())
    path = tmp_path / "noncanonical.json"
    path.write_bytes(crafted)
    code, err = _main(capsys, "show", str(path))
    assert code == 2 and "digest does not match" in err
    # Float literals: "1e-05" is not how RFC 8785 writes 0.00001.
    from manifest.canonical import _floats_canonical

    assert _floats_canonical(["0.5", "0.00001"]) and not _floats_canonical(["1e-05"])
    assert not _floats_canonical(["1.0"])


def test_hash_of_an_empty_path_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _main(capsys, "hash", "")
    assert code == 2 and "empty" in err
    _one_sentence(err)


@pytest.mark.skipif(not Path("/sys/kernel/mm").is_dir(), reason="no sysfs here")
def test_sysfs_tree_is_refused_quickly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    code, err = _main(capsys, "hash", "-q", "--no-cache", "--store", str(tmp_path),
                      "/sys/kernel/mm")
    elapsed = time.monotonic() - started
    # Root reads every file and meets the pseudo-files; another user is refused some
    # entries first. Either way: one sentence, exit 2, quickly.
    assert code == 2
    assert "pseudo-file" in err or (os.geteuid() != 0 and "permission denied" in err), err
    assert elapsed < 5  # it was 0.15 s of retry sleep per file: 40 s for 290 files


@pytest.mark.parametrize(("config", "expected"), [
    (f"seed = {2**60}", "seed must be an integer from 0 to"),
    ('seed = "x"', "seed must be an integer"),
    ("threads = 0", "threads must be an integer"),
    ('command = 3', "command must be"),
    ("data = [1]", "data must be a list of strings"),
])
def test_bad_tool_manifest_is_a_sentence_for_capture_and_gate(
        tmp_path: Path, config: str, expected: str) -> None:
    repo = make_repo(tmp_path / "repo", {"pyproject.toml": (
        f'[tool.manifest]\n{config}\n[tool.manifest.gate]\nbaseline = "b.json"\n')},
        example=False)
    for args in (["capture", "-q", "--", "python", "-c", "pass"], ["gate", "--no-rerun"]):
        proc = _run(*args, cwd=repo)
        assert proc.returncode == 2, proc.stderr
        err = proc.stderr.decode()
        assert expected in err
        _one_sentence(err)


def test_per_rank_seed_overflow_is_a_sentence(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"t.py": "pass\n"}, example=False)
    ok = manifest_cli("capture", "-q", "--seed", str(2**53 - 1), "--per-rank-seed", "--",
                      "python", "t.py", cwd=repo, env={"RANK": "0"})
    assert ok.returncode == 0, ok.stderr.decode()  # positive control: rank 0 fits
    proc = manifest_cli("capture", "-q", "--seed", str(2**53 - 1), "--per-rank-seed", "--",
                        "python", "t.py", cwd=repo, env={"RANK": "1"})
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert "above 2**53-1" in err
    _one_sentence(err)
