"""No marker for envelope runs, no ``equivalent`` from an unchecked trail, one bound shown.

Real CPU training through the CLI (the bundled example, run by a script that first writes
down everything it can see):

* every run of ``capture --envelope N`` and ``verify --envelope N`` starts from the tree
  the real run started from, with the same environment and argv (the thread-count run
  differs in its thread count alone): the real run cannot be told from the others;
* a script that trains differently when its output is already there gets nothing from it:
  a planted output is not ``equivalent`` (exit 1), the honest one is (exit 4);
* diff compares both runs' outputs numerically before it says ``equivalent``: a run whose
  trail was replaced by another's and re-sealed is not (exit 1), the same forgery of an
  honest run is (exit 4), and a single file for both runs is not compared;
* ``show`` prints the bound the verdict uses, for 6 runs and for a 3-run envelope.

The order of the real run among the verifier's runs, and what ``reset`` undoes, are
checked in-process with stand-in runs (no training).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from manifest.canonical import dumps, seal
from manifest.trust import record_sealed
from tests.runs import git, make_repo, manifest_cli

STEPS = "12"

PROBE = """\
import hashlib, json, os, runpy, sys
from pathlib import Path

import torch

HERE = Path.cwd()


def seen():
    \"\"\"Everything this run can see that is not a clock: the tree (paths and content
    digests, no times), the environment (as the kernel gave it), argv, cwd, threads.\"\"\"
    tree = []
    for dirpath, dirnames, filenames in os.walk(HERE):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        rel = os.path.relpath(dirpath, HERE)
        tree.append(rel + "/")
        for name in sorted(filenames):
            with open(os.path.join(dirpath, name), "rb") as fh:
                tree.append(os.path.join(rel, name) + " "
                            + hashlib.sha256(fh.read()).hexdigest())
    raw = Path("/proc/self/environ").read_bytes().split(b"\\0")
    env = dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)
    records = env.get("MANIFEST_LAUNCH_RECORDS", "")
    threads = {k: env.pop(k, None) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if "MANIFEST_LAUNCH" in env:
        launch = json.loads(env["MANIFEST_LAUNCH"])
        threads["launch"] = launch.pop("threads", None)
        env["MANIFEST_LAUNCH"] = json.dumps(launch, sort_keys=True)
    # the launcher's records directory: a fresh random name in every run, the real one too
    env = {k: v.replace(records, "<records>") if records else v for k, v in env.items()}
    threads["torch"] = torch.get_num_threads()
    return {"tree": tree, "env": env, "argv": sys.argv, "cwd": str(HERE), "threads": threads}


with open(os.environ["PROBE_LOG"], "a") as fh:
    fh.write(json.dumps(seen(), sort_keys=True) + "\\n")
if Path("out/model.safetensors").exists():  # the hostile part: acts on its own output
    SGD = torch.optim.SGD
    torch.optim.SGD = lambda params, lr, **kw: SGD(params, lr=lr * 1.05, **kw)
sys.argv = ["train.py", *sys.argv[1:]]
runpy.run_path("train.py", run_name="__main__")
"""


def _lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.read_text().splitlines()]


def _without_threads(seen: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in seen.items() if k != "threads"}


def _resealed(path: Path, doc: dict[str, Any]) -> Path:
    """``doc`` re-sealed on this machine (what anyone with the file and this tool can do)."""
    doc = dict(doc, observed=dict(doc["observed"], duration_s=doc["observed"]["duration_s"]
                                  + 3600))
    manifest = seal(doc)
    record_sealed(manifest.digest)
    path.write_bytes(dumps(manifest))
    return path


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("probe") / "probe.log"


@pytest.fixture(scope="module")
def env(log: Path) -> dict[str, str]:
    # unconfined, so that the probe's log outside the tree is written in verify's runs too
    return {"PROBE_LOG": str(log), "MANIFEST_BWRAP": "/nonexistent/bwrap"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("nomarker") / "a", {"probe.py": PROBE})


@pytest.fixture(scope="module")
def captured(repo: Path, log: Path, env: dict[str, str]
             ) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """The run, sealed here, with a 6-run envelope (the one-ULP runs and a thread count)."""
    proc = manifest_cli("capture", "--threads", "2", "--envelope", "6", "--artifact",
                        "out/*.safetensors", "--", "python", "probe.py", "--steps", STEPS,
                        cwd=repo, env=env)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    path = repo / "run.json"
    path.write_bytes(proc.stdout)
    lines = _lines(log)
    log.unlink()
    return path, json.loads(proc.stdout), lines


# --------------------------------------------------------------- no marker (capture)


@pytest.mark.slow
def test_capture_envelope_runs_start_from_the_tree_the_run_started_from(
        repo: Path, captured: tuple[Path, dict[str, Any], list[dict[str, Any]]],
        log: Path, env: dict[str, str]) -> None:
    _, doc, lines = captured
    assert len(lines) == 8  # the run, 6 one-ULP runs, one thread-count run, in that order
    real, *envelope = lines
    assert not any("out/" in entry for entry in real["tree"])  # a fresh tree: no output yet
    for seen in envelope[:-1]:
        assert seen == real
    assert _without_threads(envelope[-1]) == _without_threads(real)
    assert envelope[-1]["threads"]["launch"] == 1 and real["threads"]["launch"] == 2
    # the run's output is back, byte for byte, after the envelope runs
    [artifact] = doc["outputs"]["artifacts"]
    import blake3

    assert doc["outputs"]["envelope"]["loss_eps"] > 0
    on_disk = blake3.blake3((repo / artifact["path"]).read_bytes()).hexdigest()
    assert artifact["digest"] == f"blake3:{on_disk}"
    # positive control: the probe sees the output where it is there (a second run, now)
    kept = (repo / artifact["path"]).read_bytes()
    try:
        proc = manifest_cli("capture", "--threads", "2", "--artifact", "out/*.safetensors",
                            "--", "python", "probe.py", "--steps", "2", cwd=repo, env=env)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        [later] = _lines(log)
    finally:
        (repo / artifact["path"]).write_bytes(kept)
        log.unlink(missing_ok=True)
    assert later["tree"] != real["tree"] and any("model.safetensors" in e for e in later["tree"])


# ---------------------------------------------------------------- no marker (verify)


@pytest.mark.slow
def test_verify_runs_the_rerun_among_its_envelope_runs_unmarked(
        repo: Path, captured: tuple[Path, dict[str, Any], list[dict[str, Any]]],
        log: Path, env: dict[str, str]) -> None:
    path, _, _ = captured
    proc = manifest_cli("verify", str(path), "--threads", "3", "--envelope", "3", "--json",
                        cwd=repo, env=env)
    report = json.loads(proc.stdout)
    lines = _lines(log)
    log.unlink()
    # the control: an honest run at another thread count is equivalent, by the verifier's
    # own envelope, its outputs compared
    assert (proc.returncode, report["verdict"]) == (4, "equivalent"), report["reason"]
    assert report["numeric"]["envelope_from"].startswith("the verifier's (4 runs here)")
    assert report["numeric"]["outputs_verdict"] == "inside"
    assert len(lines) == 5  # the re-run, 3 one-ULP runs and a thread-count run
    first = _without_threads(lines[0])
    assert all(_without_threads(seen) == first for seen in lines)
    # nobody finds an output (verify makes the output's directory before the runs: all see it)
    assert not any("model.safetensors" in entry for entry in first["tree"])
    at_three = [seen for seen in lines if seen["threads"]["launch"] == 3]
    assert len(at_three) == 4 and all(seen == at_three[0] for seen in at_three)


@pytest.mark.slow
def test_a_script_that_acts_on_its_own_output_gets_no_equivalent(
        repo: Path, captured: tuple[Path, dict[str, Any], list[dict[str, Any]]],
        env: dict[str, str], log: Path, tmp_path: Path) -> None:
    """The recorded weights carry a change an honest re-run does not make; the script would
    widen the verifier's envelope in every run that finds its output (lr × 1.05): no run
    finds it, so the envelope is rounding's and the change is outside it."""
    from safetensors.torch import load_file, save_file

    from manifest.weights.tables import digest_artifact

    _, doc, _ = captured
    [artifact] = doc["outputs"]["artifacts"]
    original = repo / artifact["path"]
    kept = tmp_path / "model.safetensors"
    shutil.copyfile(original, kept)
    try:
        tensors = load_file(str(original))
        tensors["fc.bias"] = tensors["fc.bias"] + 1e-3
        save_file(tensors, str(original))
        planted = copy.deepcopy(doc)
        planted["outputs"]["artifacts"] = [
            digest_artifact(original, artifact["path"]).model_dump(mode="json")]
        path = _resealed(repo / "planted.json", planted)
        proc = manifest_cli("verify", str(path), "--threads", "3", "--envelope", "3",
                            "--json", cwd=repo, env=env)
    finally:
        shutil.copyfile(kept, original)
        if log.exists():
            log.unlink()
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["verdict"]) == (1, "differs"), report["reason"]
    assert report["numeric"]["trail_verdict"] == "equivalent"  # only the output gives it away
    assert report["numeric"]["outputs_verdict"] == "outside"


# -------------------------------------------------------------- the order, in-process


def _fake_result(records: list[dict[str, Any]], opened: dict[str, str]) -> Any:
    return SimpleNamespace(exit_code=0, records=records, opened=opened)


def test_the_real_run_takes_a_drawn_place_and_each_run_finds_the_start(tmp_path: Path) -> None:
    from manifest.launch.runner import LaunchSettings
    from manifest.numeric.measure import listing, measure

    tree = tmp_path / "tree"
    (tree / "data").mkdir(parents=True)
    (tree / "data" / "kept.txt").write_text("the user's")
    point = {"step": 1, "loss": 1.0, "loss_eps": 2.0 ** -23, "groups": [[1.0, 0.5, 0.5]]}
    places: set[int] = set()
    for _ in range(40):
        order: list[str] = []
        seen: list[set[str]] = []
        start = listing(tree)

        def run(planned: Any, order: list[str] = order, seen: list[set[str]] = seen) -> Any:
            seen.append(listing(tree))
            order.append("envelope")
            out = tree / "out" / "model.bin"
            out.parent.mkdir(exist_ok=True)
            out.write_text(f"envelope {len(order)}")
            return _fake_result([{"rank": 0, "numeric": [point]}], {str(out): "w"})

        def real(order: list[str] = order, seen: list[set[str]] = seen) -> Any:
            seen.append(listing(tree))
            order.append("real")
            out = tree / "out" / "model.bin"
            out.parent.mkdir(exist_ok=True)
            out.write_text("the real run's")
            return _fake_result([{"rank": 0, "numeric": [point]}], {str(out): "w"})

        settings = LaunchSettings(seed=0, derivation="same", threads=2, deterministic=True)
        measured = measure([], settings, 3, run, cwd=tree, outputs=["out/*"], tree=tree,
                           start=start, owned=True, real=real)
        assert measured.real is not None and measured.envelope is not None
        assert all(s == start for s in seen)  # every run, the real one too, finds the start
        assert (tree / "out" / "model.bin").read_text() == "the real run's"
        assert (tree / "data" / "kept.txt").read_text() == "the user's"
        places.add(order.index("real"))
        shutil.rmtree(tree / "out")
    assert places == {0, 1, 2, 3, 4}  # 40 draws of 5 places: all seen (1 in 10^3 misses one)


def test_reset_in_the_users_tree_leaves_files_no_run_wrote(tmp_path: Path) -> None:
    from manifest.numeric.measure import files_kept, listing

    tree = tmp_path / "tree"
    tree.mkdir()
    start = listing(tree)
    (tree / "out").mkdir()
    (tree / "out" / "model.bin").write_text("the run's")
    with files_kept(tree, ["out/*"], tree=tree, start=start) as kept:
        kept.reset()
        assert not (tree / "out").exists()  # the run's output and its directory: moved out
        (tree / "notes.txt").write_text("typed by the user meanwhile")
        (tree / "log.txt").write_text("an envelope run's")
        kept.written({str(tree / "log.txt"): "w"})
        kept.reset()
        assert (tree / "notes.txt").exists() and not (tree / "log.txt").exists()
    assert (tree / "out" / "model.bin").read_text() == "the run's"
    assert (tree / "notes.txt").exists()


# ------------------------------------------------------------------ diff (class 1)


@pytest.fixture(scope="module")
def elsewhere(repo: Path, captured: tuple[Path, dict[str, Any], list[dict[str, Any]]],
              env: dict[str, str], log: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Two more clones of the repository: B, an honest run at 3 threads; and C, where the
    script ran twice, so that the second run found its output and trained at lr × 1.05."""
    runs: dict[str, tuple[Path, dict[str, Any]]] = {}
    for name, times in (("b", 1), ("c", 2)):
        clone = repo.parent / name
        git(repo.parent, "clone", "-q", str(repo), str(clone))
        for _ in range(times):
            proc = manifest_cli("capture", "--threads", "3", "--artifact", "out/*.safetensors",
                                "--", "python", "probe.py", "--steps", STEPS, cwd=clone,
                                env=env)
            assert proc.returncode == 0, proc.stderr.decode()[-2000:]
            (clone / "run.json").write_bytes(proc.stdout)
            runs[name] = (clone / "run.json", json.loads(proc.stdout))
    if log.exists():
        log.unlink()
    return runs


@pytest.mark.slow
def test_diff_compares_the_outputs_before_it_says_equivalent(
        repo: Path, captured: tuple[Path, dict[str, Any], list[dict[str, Any]]],
        elsewhere: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    a, doc, _ = captured
    b, honest = elsewhere["b"]
    c, lr = elsewhere["c"]
    proc = manifest_cli("diff", str(a), str(b), "--json", cwd=repo)
    result = json.loads(proc.stdout)
    assert (proc.returncode, result["outputs"]) == (4, "equivalent"), proc.stdout[-3000:]
    assert result["numeric"]["outputs_verdict"] == "inside"
    # the lr run as captured: exit 1 (its second capture also differs in the checkout)
    proc = manifest_cli("diff", str(a), str(c), "--json", cwd=repo)
    assert proc.returncode == 1, proc.stdout[-3000:]
    # the forgery: B's manifest, whose every input differs from A's in rounding only, with
    # the lr run's weights (on disk where they are recorded) and A's trail, re-sealed here
    forged = copy.deepcopy(honest)
    forged["outputs"]["artifacts"] = lr["outputs"]["artifacts"]
    forged["outputs"]["processes"] = [
        dict(p, numeric=q["numeric"], trail=q["trail"])
        for p, q in zip(forged["outputs"]["processes"], doc["outputs"]["processes"],
                        strict=True)]
    forged_path = _resealed(c.parent / "forged.json", forged)
    proc = manifest_cli("diff", str(a), str(forged_path), "--json", cwd=repo)
    result = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert result["numeric"]["trail_verdict"] == "equivalent"  # the trails alone would pass
    assert result["numeric"]["outputs_verdict"] == "outside"
    text = manifest_cli("diff", str(a), str(forged_path), cwd=repo).stdout.decode()
    assert "differ beyond rounding" in " ".join(text.split())
    # the control: the same forgery of the honest run is equivalent (its outputs are)
    twin = copy.deepcopy(honest)
    twin["outputs"]["processes"] = [
        dict(p, numeric=q["numeric"], trail=q["trail"])
        for p, q in zip(twin["outputs"]["processes"], doc["outputs"]["processes"],
                        strict=True)]
    twin_path = _resealed(b.parent / "twin.json", twin)
    proc = manifest_cli("diff", str(a), str(twin_path), "--json", cwd=repo)
    assert proc.returncode == 4, proc.stdout[-3000:]
    # B's manifest moved into A's repository: one file for both runs, never compared
    moved = repo / "b-here.json"
    shutil.copyfile(b, moved)
    proc = manifest_cli("diff", str(a), str(moved), cwd=repo)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "same place" in " ".join(proc.stdout.decode().split())
    # and from stdin, where no repository holds the outputs
    with open(b, "rb") as fh:
        import subprocess
        import sys

        piped = subprocess.run([sys.executable, "-m", "manifest", "diff", str(a), "-"],
                               stdin=fh, cwd=repo, capture_output=True, timeout=300,
                               check=False)
    assert piped.returncode == 1, piped.stdout[-3000:] + piped.stderr[-3000:]
    assert "repository is not known" in " ".join(piped.stdout.decode().split())


# ------------------------------------------------------------------ show (class 5)


def _shown_bounds(repo: Path, path: Path) -> dict[int, tuple[str, str]]:
    proc = manifest_cli("show", str(path), cwd=repo)
    assert proc.returncode == 0, proc.stderr.decode()
    found = re.findall(r"envelope step (\d+)\s+parameters (\S+), loss (\S+) \(relative\)",
                       proc.stdout.decode())
    assert found, proc.stdout.decode()
    return {int(step): (params, loss) for step, params, loss in found}


@pytest.mark.slow
@pytest.mark.parametrize("ulp_runs", [6, 3])
def test_show_prints_the_bound_the_verdict_uses(
        repo: Path, captured: tuple[Path, dict[str, Any], list[dict[str, Any]]],
        ulp_runs: int) -> None:
    from manifest.models import Envelope, NumericPoint
    from manifest.numeric.envelope import judge

    path, doc, _ = captured
    if ulp_runs != 6:  # the gate's baseline: 3 one-ULP runs and the thread count
        doc = copy.deepcopy(doc)
        envelope = doc["outputs"]["envelope"]
        keep = [*range(ulp_runs), len(envelope["runs"]) - 1]
        envelope["runs"] = [envelope["runs"][i] for i in keep]
        for step in envelope["steps"]:
            step["loss"] = [step["loss"][i] for i in keep]
            step["groups"] = [[g[i] for i in keep] for g in step["groups"]]
        path = _resealed(repo / f"envelope-{ulp_runs}.json", doc)
    envelope = Envelope.model_validate(doc["outputs"]["envelope"])
    trail = [NumericPoint.model_validate(p) for p in doc["outputs"]["processes"][0]["numeric"]]
    # the verdict's own bound at the first step: a re-run whose loss doubles there
    assert trail[0].loss is not None
    moved = [trail[0].model_copy(update={"loss": trail[0].loss * 2}), *trail[1:]]
    verdict = judge(trail, moved, envelope)
    assert verdict.verdict == "differs" and verdict.where == "loss" and verdict.bound
    shown = _shown_bounds(repo, path)
    first = min(shown)
    assert shown[first][1] == f"{verdict.bound:.2g}"
    assert float(shown[first][1]) < 1  # a relative bound, not 5.7e+69
    # every milestone: the verdict's calibration, parameters and loss
    from manifest.numeric.calibration import verdict_calibration

    fitted = {b.step: b for b in verdict_calibration(envelope, trail).bounds}
    for step, (params, loss) in shown.items():
        assert params == f"{max(fitted[step].groups):.2g}"
        assert loss == f"{fitted[step].loss:.2g}"
