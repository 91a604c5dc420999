"""The report says what happened (issue 31): a container image is checked against the OCI
reference grammar before it is rendered into a pod spec, and the confinement line of a
cluster re-run is what the host that ran it applied.

``tests/hostile/conformance/image/<case>.json``: ``image`` (``repeat``: the image that
many times; ``repeat_tag``: a tag of that many characters appended; ``repeat_path``:
the image repeated, then ``x``), given as ``--image`` (``source: flag``) or recorded in
the manifest's ``env.container.image_digest`` (``source: recorded``), for ``verify --on
k8s --dry-run``. A ``*_fail`` case ends with exit 2, one sentence, nothing rendered on
stdout, within the limit (the figure is printed); an ``*_ok`` case renders through the
real Kubernetes client's models with the image as given.

Positive controls: the plain renderer copies a newline, a YAML document marker and
100,000 characters into the pod spec; the plan's confinement line, a prediction made
before the job ran, is not what the submitit local fallback applied on this machine.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import assert_one_sentence
from tests.runs import manifest_cli

HERE = Path(__file__).parent / "conformance" / "image"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "manifest_v1.json"
LIMIT_S = 20.0


def _cases() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.json"))


def _image(case: dict[str, Any]) -> str:
    image: str = case["image"] * case.get("repeat", 1)
    if case.get("repeat_tag"):
        image += "t" * case["repeat_tag"]
    if case.get("repeat_path"):
        image = case["image"] * case["repeat_path"] + "x"
    return image


def _manifest(image: str | None) -> bytes:
    from manifest.canonical import dumps, seal

    doc: dict[str, Any] = json.loads(GOLDEN.read_bytes())
    doc["code"]["diff_digest"] = None
    doc["env"]["container"]["image_digest"] = image
    return dumps(seal(doc))


@pytest.mark.parametrize("name", _cases())
def test_image_case(name: str, tmp_path: Path) -> None:
    pytest.importorskip("kubernetes", reason="the k8s extra is not installed")
    case: dict[str, Any] = json.loads((HERE / f"{name}.json").read_text())
    assert name.endswith(("_ok", "_fail")), name
    image = _image(case)
    if name.endswith("_ok"):
        from manifest.rerun.cluster.image import check_reference
        from manifest.rerun.cluster.k8s import render

        assert check_reference(image) == image
        _, job = render(name="manifest-x", bundle_name="blake3:" + "ab" * 32, image=image,
                        namespace="default", nodes=1, threads=1, gpus=0, claim=None)
        assert job.spec.template.spec.containers[0].image == image
        return
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=120)
    recorded = case["source"] == "recorded"
    (tmp_path / "run.json").write_bytes(_manifest(image if recorded else None))
    flag = [] if recorded else ["--image", image]
    started = time.monotonic()
    proc = manifest_cli("verify", "run.json", "--on", "k8s", "--dry-run", *flag,
                        cwd=tmp_path, timeout=LIMIT_S * 3)
    elapsed = time.monotonic() - started
    print(f"image/{name}: exit {proc.returncode} in {elapsed:.3f} s")
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert elapsed < LIMIT_S
    assert proc.stdout == b""  # nothing rendered
    assert_one_sentence(err)
    assert "refusing to render it" in err
    assert len(err) < 1000  # a 100,000-character image is shown shortened


def test_control_the_plain_renderer_copies_the_image_into_the_pod_spec() -> None:
    pytest.importorskip("kubernetes", reason="the k8s extra is not installed")
    from kubernetes import client

    from manifest.rerun.cluster.k8s import to_yaml

    for image in ("img:1\n---\napiVersion: v1\nkind: Pod", "a" * 100_000):
        pod = client.V1Pod(api_version="v1", kind="Pod", spec=client.V1PodSpec(
            containers=[client.V1Container(name="rerun", image=image)]))
        text = to_yaml((pod,))
        assert len(text) > 100_000 or "kind: Pod" in text.split("image:")[1]


def test_slurm_without_sbatch_is_named_the_local_executor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from manifest.rerun.cluster import cluster_options

    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: submitit runs the job here
    described = cluster_options("slurm", {}, {}).describe()
    assert described == "submitit local executor on this machine (no sbatch on PATH)"


def test_slurm_local_reports_the_confinement_that_was_applied(tmp_path: Path) -> None:
    """verify --on slurm through submitit's local executor (as without sbatch) runs the job
    on this machine: the report says what that host applied (not confined where bubblewrap
    is absent), not the plan's prediction."""
    pytest.importorskip("submitit", reason="the slurm extra is not installed")
    from tests.runs import capture, make_repo

    repo = make_repo(tmp_path / "repo", {})
    (repo / "pyproject.toml").write_text(
        "[tool.manifest.executors.slurm]\n"
        f"folder = {json.dumps(str(tmp_path / 'slurm'))}\nlocal = true\ntime_min = 10\n")
    manifest, _ = capture(repo, command=["python", "train.py", "--steps", "5"])
    proc = manifest_cli("verify", str(manifest), "--json", "--on", "slurm", cwd=repo,
                        timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()
    report = json.loads(proc.stdout)
    line, job = report["confinement"], report["job"]
    assert line.startswith("on submitit local executor on this machine"), line
    assert line.endswith(job["confinement"]), (line, job)
    from manifest.rerun.sandbox import unavailable_reason

    if unavailable_reason() is not None:
        assert "not confined on the host" in line, line
        # Positive control: the plan's line, made before the job ran, promised bubblewrap.
        assert "bubblewrap" in report["plan"]["confinement"]
        assert "not confined on the host" not in report["plan"]["confinement"]
    else:
        assert line.split(": ", 1)[1].startswith("bubblewrap on "), line
