"""``verify`` and ``explain --on ray`` against a real Ray cluster on 127.0.0.1, started and
stopped here (issue 23).

The head is ``ray start --head --block`` in its own session with a private
temp dir; teardown stops that process group and then any process left that
names the temp dir (Ray's daemons), by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_runs import EXPLAIN_KEYS, explain_both, threads_manifest
from tests.ray_cluster import processes_with as _ours
from tests.runs import capture, free_port, make_repo, manifest_cli

pytest.importorskip("ray.job_submission", reason="the ray extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    temp = tempfile.mkdtemp(prefix="mfray-", dir="/tmp")  # socket paths must stay short
    port, dash, agent, grpc, metrics, runtime = (free_port() for _ in range(6))
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
         "--num-cpus=2", f"--temp-dir={temp}", f"--port={port}", f"--dashboard-port={dash}",
         "--dashboard-host=127.0.0.1", "--node-ip-address=127.0.0.1",
         "--include-dashboard=true", "--disable-usage-stats",
         # Every port chosen here, so a Ray another user runs on this machine cannot clash.
         f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
         f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime}"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{address}/api/version", timeout=2):  # noqa: S310
                    break
            except OSError:
                if time.monotonic() > deadline or head.poll() is not None:
                    pytest.fail("the Ray head did not come up")
                time.sleep(1)
        yield address
    finally:
        # SIGTERM to the head's group and to every daemon naming the temp dir, then SIGKILL
        # to whatever is left after 5 s (``ray start --block`` alone took 30 s to go).
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, sig)
            for pid in _ours(temp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while (head.poll() is None or _ours(temp)) and time.monotonic() < deadline:
                time.sleep(0.2)
        head.wait()
        import shutil

        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    repo = make_repo(tmp_path_factory.mktemp("ray") / "repo", {})
    # Uncommitted: the patch travels in the bundle and is checked on arrival.
    (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# uncommitted\n")
    path, doc = capture(repo, command=["python", "train.py", "--steps", "20"])
    assert doc["code"]["diff_digest"]
    return repo, path


def _verify(repo: Path, manifest: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = manifest_cli("verify", str(manifest), "--json", "--on", "ray", *args, cwd=repo,
                        timeout=600)
    return proc.returncode, json.loads(proc.stdout or b"{}"), proc.stderr.decode()


def test_verify_on_ray_is_identical(ray_address: str, recorded: tuple[Path, Path]) -> None:
    repo, manifest = recorded
    with_credentials = ray_address.replace("http://", "http://alice:s3cret@")
    code, report, stderr = _verify(repo, manifest, "--address", with_credentials)
    assert code == 0, stderr
    assert report["verdict"] == "identical"
    job = report["job"]
    assert job["executor"] == "ray"
    assert job["job_id"].startswith("manifest-")
    assert job["where"] == f"{ray_address}/#/jobs/{job['job_id']}"
    assert job["bundle"].startswith("blake3:")
    assert job["network"]  # the report states the re-run's network policy
    assert job["bytes_shipped"] > 0 and not job["outputs_fetched"]
    assert report["plan"]["executor"] == "ray"
    everything = json.dumps(report) + stderr
    assert "s3cret" not in everything and "alice" not in everything


def test_threads_changed_differs_located(ray_address: str, recorded: tuple[Path, Path]) -> None:
    repo, manifest = recorded
    recorded_threads = json.loads(manifest.read_text())["determinism"]["num_threads"]
    other = 1 if recorded_threads != 1 else 2
    code, report, stderr = _verify(repo, manifest, "--address", ray_address,
                                   "--threads", str(other))
    assert code == 1, stderr
    assert report["verdict"] == "differs"
    assert report["first_divergent_step"] is not None  # located: the step the runs part
    changed = [t for a in report["artifacts"] for t in a["tensors"]]
    assert changed and all(t["name"] for t in changed)
    assert "stayed on ray" in report["artifacts"][0]["detail"]


def test_edited_patch_is_refused_on_arrival(ray_address: str, tmp_path: Path) -> None:
    """A patch edited after the bundle was named (in transit, on shared storage) is refused
    by the job before anything runs; the same bundle unedited runs (positive control)."""
    import blake3

    from manifest.capture.launcher import LaunchSettings
    from manifest.errors import NoVerdictError
    from manifest.rerun.cluster import cluster_options
    from manifest.rerun.cluster.bundle import PATCH, build_bundle
    from manifest.rerun.cluster.ray import RayExecutor

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "run.py").write_text("print('ran')\n")
    patch = b"diff --git a/run.py b/run.py\n"
    settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True)

    class Plan:
        verb, argv = "verify", ("python", "run.py")
        topology: dict[str, int] = {}  # noqa: RUF012 - a stand-in read only
        settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True)

    executor = RayExecutor(cluster_options("ray", {"address": ray_address,
                                                   "timeout_s": 300}, {}))
    results = {}
    for edited in (False, True):
        bundle = build_bundle(
            tmp_path / f"bundle-{edited}", tree=tree, cwd=tree, mount_at=tree,
            argv=Plan.argv, outputs=[], patch=patch, commit="0" * 40,
            diff_digest="blake3:" + blake3.blake3(patch).hexdigest(),
            settings=settings.__dict__, env=dict(os.environ), sandbox=False)
        if edited:
            (bundle.path / PATCH).write_bytes(patch + b"+planted\n")
        job = executor.submit(Plan(), bundle)  # type: ignore[arg-type]
        try:
            results[edited] = executor._wait(job, Plan())  # type: ignore[arg-type]
        except NoVerdictError as exc:
            results[edited] = {"error": exc.message}
    assert results[False]["exit_code"] == 0
    assert "refused the bundle on arrival" in results[True]["error"]
    # The index records each file's size: a grown patch is refused before it is hashed.
    assert "refusing to run edited code" in results[True]["error"]


def test_timeout_cancels_the_job(ray_address: str, recorded: tuple[Path, Path]) -> None:
    repo, manifest = recorded
    code, _, stderr = _verify(repo, manifest, "--address", ray_address, "--timeout", "1")
    assert code == 3, stderr
    assert "did not finish within 1 s" in stderr and "cancelled" in stderr



def test_explain_on_ray_names_what_a_local_explain_names(
        ray_address: str, recorded: tuple[Path, Path]) -> None:
    """explain runs the plan four times (two op windows writing to its writable
    directories): on Ray each is a job, and the findings are the local ones."""
    repo, _ = recorded
    manifest = threads_manifest(repo)
    here, there = explain_both(repo, manifest, "--on", "ray", "--address", ray_address)
    assert here["verdict"] == "parted" and here["findings"], here  # positive control
    assert {k: there[k] for k in EXPLAIN_KEYS} == {k: here[k] for k in EXPLAIN_KEYS}
    assert here["findings"][0]["op"].startswith("aten::")
    assert there["plan"]["executor"] == "ray" and "jobs" not in here
    assert [j["run"] for j in there["jobs"]] == list(there["timings_s"])
    assert all(j["executor"] == "ray" and j["job_id"].startswith("manifest-")
               for j in there["jobs"])
