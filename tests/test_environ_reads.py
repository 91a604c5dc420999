"""The environment variables a run's own code read (issue 36, item 6).

A script that reads ``LRSCALE`` computes another run under another value. The
launcher records each variable the script's own code read, where, and a digest
of its value (``launch/boot/_manifest_environ``); ``diff`` and ``verify`` name
one whose value differs as a ``bits`` cause, and the run_id follows it.

The hook's tests run the real launcher (``sitecustomize`` on ``PYTHONPATH``) on
small scripts. Their positive control is a naive twin put *below* the hook
(``_manifest_environ._original`` wrapped): it sees every key that reaches
``os._Environ.__getitem__``, so what it saw and the record lacks is what the
hook chose to leave out. The end-to-end test captures a tiny training script
three times and verifies it twice.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import blake3
import pytest

from manifest.canonical import seal
from manifest.capture.environ import (
    NOT_RECORDED,
    _machine_key,
    environ_reads,
    environ_recorded,
    key_name,
    keyed_digest,
    keyed_reads,
    read_changes,
    reads_not_compared,
)
from manifest.diff.engine import diff_manifests
from manifest.diff.rules import REFINED, Impact
from manifest.launch.runner import LaunchSettings, ProcessRecord
from manifest.models import Manifest
from manifest.redact import is_secret_name
from tests.golden.diff import make_pairs
from tests.runs import make_repo, manifest_cli

TWIN = """\
import _manifest_environ as _hook
_seen = set()
_inner = _hook._original
def _naive(self, key):
    _seen.add(key.decode() if isinstance(key, bytes) else key)
    return _inner(self, key)
_hook._original = _naive
"""
"""A hook that counts every key reaching ``__getitem__``, installed below ours."""

TWIN_END = """
import json as _json, os as _os
with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "seen.json"), "w") as _f:
    _json.dump(sorted(_seen), _f)
"""


KEY = bytes(range(32))
"""A fixed key for the digests of tests that build records by hand."""

SECRET = "hunter2"
"""A low-entropy secret: the kind a plain digest would give back to a dictionary attack."""


def digest_of(value: str) -> bytes:
    return str(blake3.blake3(value.encode()).hexdigest()).encode()


def _launched(tmp_path: Path, body: str, env: dict[str, str]) -> tuple[dict[str, Any], set[str]]:
    """Run ``body`` under the real launcher: (its record's ``environ``, what the twin saw)."""
    record, seen = _launched_record(tmp_path, body, env)
    return record["environ"], seen


def _launched_record(tmp_path: Path, body: str,
                     env: dict[str, str]) -> tuple[dict[str, Any], set[str]]:
    """Run ``body`` under the real launcher: (its whole record, what the twin saw)."""
    records = tmp_path / "records"
    records.mkdir()
    script = tmp_path / "script.py"
    script.write_text(TWIN + body + TWIN_END)
    settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True,
                              trail="off", root=str(tmp_path), numeric=False)
    child = settings.child_env(records)
    child.update(env)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=child,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    [record] = [json.loads(p.read_text()) for p in records.glob("*.json")]
    return record, set(json.loads((tmp_path / "seen.json").read_text()))


def _line_of(body: str, text: str) -> int:
    return len(TWIN.splitlines()) + next(
        i for i, line in enumerate(body.splitlines(), 1) if text in line)


def test_keyed_reads_are_recorded_with_their_site_and_bulk_copies_are_not(
        tmp_path: Path) -> None:
    body = """\
import os
a = os.environ["READ_SUBSCRIPT"]
b = os.environ.get("READ_GET")
c = os.getenv("READ_GETENV")
d = "READ_UNSET" in os.environ
e = os.environ.setdefault("READ_SETDEFAULT", "fallback")
whole = dict(os.environ)
spread = {**os.environ}
copied = os.environ.copy()
pairs = [v for k, v in os.environ.items()]
assert whole["BULK_ONLY"] == spread["BULK_ONLY"] == copied["BULK_ONLY"] == "bulk"
"""
    values = {"READ_SUBSCRIPT": "1", "READ_GET": "2", "READ_GETENV": "3", "BULK_ONLY": "bulk"}
    reads, seen = _launched(tmp_path, body, values)
    # The twin saw the bulk copies reach __getitem__: a hook counting calls would record it.
    assert "BULK_ONLY" in seen
    assert "BULK_ONLY" not in reads
    for name in ("READ_SUBSCRIPT", "READ_GET", "READ_GETENV"):
        assert reads[name]["set"] is True
        assert reads[name]["digest"] == "blake3:" + blake3.blake3(
            values[name].encode()).hexdigest()
    assert reads["READ_UNSET"] == {"site": f"script.py:{_line_of(body, 'READ_UNSET')}",
                                   "set": False, "digest": None}
    assert reads["READ_SUBSCRIPT"]["site"] == f"script.py:{_line_of(body, 'READ_SUBSCRIPT')}"
    # setdefault on an unset variable: unset when read, the script's default took over.
    assert reads["READ_SETDEFAULT"]["set"] is False
    assert set(reads) == {"READ_SUBSCRIPT", "READ_GET", "READ_GETENV", "READ_UNSET",
                          "READ_SETDEFAULT"}


def test_library_and_launcher_reads_are_not_the_runs(tmp_path: Path) -> None:
    """torch reads KINETO_USE_DAEMON at import, the standard library reads HOME in
    expanduser, the launcher reads MANIFEST_LAUNCH: none of them is the script's read."""
    body = """\
import os
import torch
home = os.path.expanduser("~")
mine = os.environ.get("MINE")
"""
    reads, seen = _launched(tmp_path, body, {"KINETO_USE_DAEMON": "", "MINE": "x"})
    assert {"KINETO_USE_DAEMON", "HOME", "MANIFEST_LAUNCH"} <= seen  # the twin's control
    assert set(reads) == {"MINE"}


def test_a_secret_looking_name_keeps_no_digest_and_others_compared_elsewhere_go() -> None:
    record = {name: {"site": "train.py:3", "set": True,
                     "digest": "blake3:" + blake3.blake3(b"hunter2").hexdigest()}
              for name in ("HF_TOKEN", "LRSCALE", "OMP_NUM_THREADS", "MASTER_PORT", "RANK",
                           "MANIFEST_LAUNCH", "PYTHONPATH", "NCCL_PROTO",
                           # compared nowhere else: a sweep's index, the script's own switches
                           "SLURM_ARRAY_TASK_ID", "MANIFEST_MY_LR", "NCCL_DEBUG_SUBSYS",
                           "TORCHELASTIC_MY_FLAG", "OMPI_MY_FLAG", "PMI_MY_FLAG")}
    kept = environ_reads(record, key=KEY)
    assert kept is not None
    assert set(kept) == {"HF_TOKEN", "LRSCALE", "SLURM_ARRAY_TASK_ID", "MANIFEST_MY_LR",
                         "NCCL_DEBUG_SUBSYS", "TORCHELASTIC_MY_FLAG", "OMPI_MY_FLAG",
                         "PMI_MY_FLAG"}
    # control: a digest is kept, keyed, never the plain one
    assert kept["LRSCALE"].digest == keyed_digest(KEY, str(record["LRSCALE"]["digest"]))
    assert kept["LRSCALE"].digest != record["LRSCALE"]["digest"]
    assert kept["LRSCALE"].key == key_name(KEY)
    assert kept["HF_TOKEN"].digest is None
    assert kept["HF_TOKEN"].set is True


def _with_reads(reads: dict[str, Any] | None, keyed: dict[str, Any] | None = None, *,
                marker: bool = True, dropped: int = 0) -> Manifest:
    """A manifest whose rank 0 read ``reads``; ``reads=None, marker=False`` is one made
    before the launcher recorded reads, ``reads=None, marker=True`` one that read none."""
    doc = copy.deepcopy(make_pairs.base())
    if reads:
        doc["determinism"]["processes"][0]["environ"] = reads
    if keyed is not None:
        doc["outputs"]["processes"][0]["secret_reads"] = keyed
    if marker:
        doc["outputs"]["processes"][0]["environ_recorded"] = {
            "names": len(reads or {}), "dropped": dropped}
    return seal(doc)


def _read(value: str | None, site: str = "train.py:4", key: bytes = KEY) -> dict[str, Any]:
    if value is None:
        return {"site": site, "set": False, "digest": None}
    return {"site": site, "set": True, "key": key_name(key),
            "digest": keyed_digest(key, "blake3:" + digest_of(value).decode())}


def test_diff_labels_another_value_bits_and_the_same_value_nothing() -> None:
    base = _with_reads({"LRSCALE": _read("1"), "HF_TOKEN": _read(None)})
    same = diff_manifests(base, _with_reads({"LRSCALE": _read("1"), "HF_TOKEN": _read(None)}))
    assert same.differences == ()  # the control: an equal read is no line
    other = _with_reads({"LRSCALE": _read("2"), "HF_TOKEN": _read(None)})
    assert other.run_id != base.run_id  # in identity: another value is another run
    [line] = diff_manifests(base, other).differences
    assert (line.path, line.impact) == ("determinism.processes[0].environ[LRSCALE].digest",
                                        Impact.BITS)
    # No digest of a value is printed, keyed or not.
    assert line.reason == ("rank 0 LRSCALE changed: another value, read by the run's own "
                           "code: the run's inputs differ")
    unset = diff_manifests(base, _with_reads({"LRSCALE": _read(None),
                                              "HF_TOKEN": _read(None)})).differences
    assert {(d.path, d.impact) for d in unset} == {
        ("determinism.processes[0].environ[LRSCALE].set", Impact.BITS),
        ("determinism.processes[0].environ[LRSCALE].digest", Impact.BITS),
        ("determinism.processes[0].environ[LRSCALE].key", Impact.BENIGN)}
    moved = diff_manifests(base, _with_reads({"LRSCALE": _read("1", "train.py:9"),
                                              "HF_TOKEN": _read(None)})).differences
    assert [(d.path, d.impact) for d in moved] == [
        ("determinism.processes[0].environ[LRSCALE].site", Impact.BENIGN)]


def test_keyed_secret_digests_stay_outside_identity_and_benign_in_diff() -> None:
    key = "blake3:" + digest_of("key").decode()
    a = _with_reads({"HF_TOKEN": {"site": "t.py:1", "set": True, "digest": None}},
                    {"HF_TOKEN": {"key": key, "digest": "blake3:" + digest_of("x").decode()}})
    b = _with_reads({"HF_TOKEN": {"site": "t.py:1", "set": True, "digest": None}},
                    {"HF_TOKEN": {"key": key, "digest": "blake3:" + digest_of("y").decode()}})
    assert a.run_id == b.run_id and a.digest != b.digest
    [line] = diff_manifests(a, b).differences
    assert line.impact is Impact.BENIGN
    # verify, under one key, names it; under another key it says nothing.
    [(path, text)] = read_changes(a, b)
    assert path == "outputs.processes[0].secret_reads[HF_TOKEN]"
    assert text.startswith("HF_TOKEN, read by t.py:1, has another value in the re-run")
    elsewhere = _with_reads({"HF_TOKEN": {"site": "t.py:1", "set": True, "digest": None}},
                            {"HF_TOKEN": {"key": "blake3:" + digest_of("other").decode(),
                                          "digest": "blake3:" + digest_of("y").decode()}})
    assert read_changes(a, elsewhere) == []


# ------------------------------------------------ review of the first release (issue 36/6)


def test_a_manifest_made_before_reads_were_recorded_gives_no_bits_cause() -> None:
    """An absent ``environ`` means "not recorded", not "none read": verify and diff say so
    once, benign. The control: a manifest that recorded reading none, against a re-run
    that read LRSCALE, is still a bits cause (its code took another path)."""
    old = _with_reads(None, marker=False)
    again = _with_reads({"LRSCALE": _read("2")})
    assert read_changes(old, again) == []
    [(path, text)] = reads_not_compared(old, again)
    assert path == "determinism.processes[0].environ"
    assert "not compared" in text and text.endswith("the recorded run did not")
    [line] = diff_manifests(old, again).differences
    assert (line.path, line.impact) == ("determinism.processes[0].environ", Impact.BENIGN)
    assert "not compared: one run did not record" in line.reason
    # A re-run that read nothing either: said once too (the marker's own line).
    [quiet] = diff_manifests(old, _with_reads(None)).differences
    assert quiet.impact is Impact.BENIGN and quiet.path.endswith("environ_recorded")

    assert REFINED["environ-not-recorded"].why == NOT_RECORDED  # one sentence, two readers
    none_read = _with_reads(None)  # recorded, and read none
    [(_, cause)] = read_changes(none_read, again)
    assert cause == "LRSCALE was read only by the re-run (at train.py:4): the code took " \
        "another path"
    assert reads_not_compared(none_read, again) == []
    lines = {(d.path, d.impact) for d in diff_manifests(none_read, again).differences}
    assert lines == {("determinism.processes[0].environ", Impact.BITS),
                     ("outputs.processes[0].environ_recorded.names", Impact.BENIGN)}


def test_a_secret_shaped_value_keeps_no_plain_digest_whatever_its_name(
        tmp_path: Path) -> None:
    """DATABASE_URL has no secret's name, but its userinfo is one: the launcher asks the
    project's redactor, and capture keeps only the keyed digest. The control: LRSCALE's
    plain digest is kept (a grep for a digest would find it)."""
    url = f"postgresql://alice:{SECRET}@db.internal/prod"
    body = """\
import os
url = os.environ["DATABASE_URL"]
hub = os.environ.get("HUB")
scale = os.environ.get("LRSCALE")
"""
    raw, _ = _launched(tmp_path, body, {"DATABASE_URL": url, "LRSCALE": "1",
                                        "HUB": "https://bob@hub.example/x"})
    assert not is_secret_name("DATABASE_URL") and not is_secret_name("HUB")
    assert raw["DATABASE_URL"]["secret"] is True and raw["HUB"]["secret"] is True
    assert "secret" not in raw["LRSCALE"]
    kept = environ_reads(raw, key=KEY)
    assert kept is not None
    assert kept["DATABASE_URL"].digest is None and kept["HUB"].digest is None
    assert kept["LRSCALE"].digest == keyed_digest(KEY, "blake3:" + digest_of("1").decode())
    keyed = keyed_reads(raw)
    assert keyed is not None and set(keyed) == {"DATABASE_URL", "HUB"}
    stored = json.dumps({k: v.model_dump() for k, v in kept.items()}).encode()
    assert digest_of(url) not in stored and digest_of("1") not in stored
    assert kept["LRSCALE"].digest.encode() in stored  # the control: the keyed one is there


def test_reads_through_a_thin_indirection_are_the_scripts_and_expanduser_is_not(
        tmp_path: Path) -> None:
    """A bound ``__getitem__`` called directly, ``map``, ``operator.itemgetter`` (C
    callables: the frame that called in is the script's) and the substitution helpers
    ``expandvars`` and ``string.Template`` count, at the script's line; ``expanduser``
    reading HOME does not (module docstring of ``_manifest_environ``). The twin saw every
    one of them reach ``__getitem__``, HOME included."""
    body = """\
import os, operator, string
a = os.environ.__getitem__("VIA_DUNDER")
b = list(map(os.environ.__getitem__, ["VIA_MAP"]))
c = operator.itemgetter("VIA_ITEMGETTER")(os.environ)
d = os.path.expandvars("$VIA_EXPANDVARS/x")
e = string.Template("$VIA_TEMPLATE").substitute(os.environ)
f = string.Template("$VIA_SAFE $NOT_SET_ANYWHERE").safe_substitute(os.environ, k=1)
g = os.environb.get(b"VIA_BYTES")
home = os.path.expanduser("~")
whole = dict(os.environ)
spread = {**os.environ}
every = list(map(os.environ.__getitem__, os.environ))
"""
    names = ["VIA_DUNDER", "VIA_MAP", "VIA_ITEMGETTER", "VIA_EXPANDVARS", "VIA_TEMPLATE",
             "VIA_SAFE", "VIA_BYTES"]
    reads, seen = _launched(tmp_path, body, {n: n.lower() for n in names} | {"BULK": "b"})
    assert {"HOME", "BULK", *names} <= seen  # the control: each reached __getitem__
    for name in names:
        assert reads[name]["site"] == f"script.py:{_line_of(body, name)}", name
        assert reads[name]["digest"] == "blake3:" + digest_of(name.lower()).decode()
    assert reads["NOT_SET_ANYWHERE"]["set"] is False  # safe_substitute asked for it
    assert set(reads) == {*names, "NOT_SET_ANYWHERE"}  # no HOME, no bulk copy


COUNTED = """\
import _manifest_environ as _h
_calls = [0]
_note = _h._note
def _counted(*args):
    _calls[0] += 1
    return _note(*args)
_h._note = _counted
"""


def test_names_past_the_limit_are_counted_so_the_list_says_it_is_incomplete(
        tmp_path: Path) -> None:
    """The first MAX_READS names are kept; the others, each read twice, are counted once."""
    body = """\
import os
os.environ.get("LRSCALE")
for i in range(300):
    os.environ.get(f"MANY_{i}")
    os.environ.get(f"MANY_{i}")
"""
    record, _ = _launched_record(tmp_path, body, {"LRSCALE": "1"})
    reads = record["environ"]
    assert len(reads) == 256 and "LRSCALE" in reads and "MANY_254" in reads  # the control
    assert "MANY_255" not in reads
    assert record["environ_dropped"] == 300 - 255
    kept = environ_recorded(cast(ProcessRecord, record))
    assert kept is not None and (kept.names, kept.dropped) == (256, 45)
    full = _with_reads(None, dropped=45)
    assert reads_not_compared(_with_reads(None), _with_reads(None)) == []  # the control
    [(path, text)] = reads_not_compared(full, _with_reads(None))
    assert path == "outputs.processes[0].environ_recorded.dropped"
    assert text.startswith("rank 0 of the recorded run read 45 variables past the "
                           "launcher's limit")


def test_repeated_reads_stop_before_the_frame_walk(tmp_path: Path) -> None:
    """A bytes key and a library's read are settled once: 2,000 repeated reads reach the
    hook's frame walk (``_note``) at most twice more, not 2,000 times (the control: the
    first reads do reach it)."""
    body = COUNTED + """\
import os
os.environb.get(b"LRSCALE")
os.path.expanduser("~")
first = _calls[0]
for _ in range(1000):
    os.environb.get(b"LRSCALE")
    os.path.expanduser("~")
with open("calls.txt", "w") as fh:
    fh.write(f"{first} {_calls[0]}")
"""
    _launched(tmp_path, body, {"LRSCALE": "1"})
    first, total = map(int, (tmp_path / "calls.txt").read_text().split())
    assert first >= 2  # the control: LRSCALE's first read and HOME's were walked
    assert total - first <= 2  # today's hook walked the frames 3,000 more times


def test_pwd_is_the_working_directory_not_a_password() -> None:
    assert not is_secret_name("PWD") and not is_secret_name("OLDPWD")
    assert is_secret_name("DB_PWD") and is_secret_name("--pwd")  # the control
    record = {name: {"site": "t.py:1", "set": True,
                     "digest": "blake3:" + digest_of("/home/u/proj").decode()}
              for name in ("PWD", "DB_PWD")}
    kept = environ_reads(record, key=KEY)
    assert kept is not None
    assert kept["PWD"].digest == keyed_digest(KEY, str(record["PWD"]["digest"]))
    assert kept["DB_PWD"].digest is None


# ------------------------------------------------------------------ end to end

TRAIN = """\
import os
import torch

scale = float(os.environ.get("LRSCALE", "1.0"))
token = os.environ.get("HF_TOKEN")
database = os.environ.get("DATABASE_URL")
torch.manual_seed(0)
w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 8))
opt = torch.optim.SGD([w], lr=0.1 * scale)
for _ in range(3):
    opt.zero_grad()
    (w * w).sum().backward()
    opt.step()
os.makedirs("out", exist_ok=True)
torch.save({"w": w.detach()}, "out/w.pt")
"""
def _capture(repo: Path, name: str, env: dict[str, str]) -> tuple[bytes, dict[str, Any]]:
    proc = manifest_cli("capture", "--threads", "1", "--artifact", "out/*.pt", "--",
                        "python", "train.py", cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    (repo / name).write_bytes(proc.stdout)
    return proc.stdout, json.loads(proc.stdout)


def _reads_of(doc: dict[str, Any]) -> dict[str, Any]:
    [process] = doc["determinism"]["processes"]
    return dict(process.get("environ") or {})


def _diff(repo: Path, a: str, b: str) -> tuple[int, list[dict[str, Any]]]:
    proc = manifest_cli("diff", "--json", a, b, cwd=repo)
    assert proc.returncode in (0, 1), proc.stderr.decode()
    return proc.returncode, json.loads(proc.stdout)["differences"]


@pytest.mark.slow
def test_a_variable_the_script_read_is_a_bits_cause_for_diff_and_verify(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"train.py": TRAIN}, example=False)
    url = f"postgresql://alice:{SECRET}@db.internal/prod"
    base = {"HF_TOKEN": SECRET, "DATABASE_URL": url}
    one, a = _capture(repo, "a.json", {**base, "LRSCALE": "1"})
    # torch reads KINETO_USE_DAEMON at import (torch/profiler/__init__.py): set only here.
    _, b = _capture(repo, "b.json", {**base, "LRSCALE": "1", "KINETO_USE_DAEMON": ""})
    _, c = _capture(repo, "c.json", {**base, "LRSCALE": "2"})

    reads = _reads_of(a)
    assert set(reads) == {"HF_TOKEN", "LRSCALE", "DATABASE_URL"}
    assert reads["LRSCALE"]["site"] == "train.py:4"

    # Same value (and another value of a variable only torch read): no line, same run_id.
    assert a["run_id"] == b["run_id"]
    _, same = _diff(repo, "a.json", "b.json")
    assert not [d for d in same if "environ" in d["path"] or "KINETO" in d["reason"]]

    # Another value: named as bits, and the run is another run.
    assert a["run_id"] != c["run_id"]
    status, other = _diff(repo, "a.json", "c.json")
    assert status == 1
    named = [d for d in other if d["path"] == "determinism.processes[0].environ[LRSCALE].digest"]
    assert len(named) == 1 and named[0]["impact"] == "bits"
    assert "the run's inputs differ" in named[0]["reason"]

    # The secret: neither its value nor its digest is in the manifest or the store, while
    # a plain variable's digest is (so a grep for one would have found it).
    stored = [one] + [p.read_bytes() for p in (repo / ".manifest").rglob("*") if p.is_file()]
    # No plain digest of any value: LRSCALE's is keyed with this user's key (the control:
    # a grep for the keyed one finds it).
    key = _machine_key()
    assert key is not None
    assert not any(digest_of("1") in blob for blob in stored)
    assert keyed_digest(key, "blake3:" + digest_of("1").decode()).encode() in one
    for blob in stored:
        assert SECRET.encode() not in blob
        assert digest_of(SECRET) not in blob
        assert digest_of(url) not in blob  # a secret by its shape, not its name
    assert reads["HF_TOKEN"] == {"site": "train.py:5", "set": True, "digest": None}
    assert reads["DATABASE_URL"] == {"site": "train.py:6", "set": True, "digest": None}

    # verify: the same value gives no such line; another value is named as the cause.
    agree = manifest_cli("verify", "a.json", cwd=repo, env={**base, "LRSCALE": "1"})
    assert agree.returncode == 0, agree.stderr.decode() + agree.stdout.decode()
    assert b"LRSCALE" not in agree.stdout
    assert b"HF_TOKEN" not in agree.stdout
    drift = manifest_cli("verify", "a.json", cwd=repo,
                         env={"LRSCALE": "2", "HF_TOKEN": SECRET + "!"})
    assert drift.returncode == 1, drift.stderr.decode() + drift.stdout.decode()
    said = drift.stdout.decode()
    assert ("drift (bits): LRSCALE, read by train.py:4, has another value in the re-run: "
            "the run's inputs differ") in said
    # The secret's value is compared on this machine by a digest under its own key.
    assert ("drift (bits): HF_TOKEN, read by train.py:5, has another value in the re-run "
            "(compared by a digest keyed on this machine): the run's inputs differ") in said
    [process] = a["outputs"]["processes"]
    assert set(process["secret_reads"]) == {"HF_TOKEN", "DATABASE_URL"}
    assert process["environ_recorded"] == {"names": 3, "dropped": 0}
