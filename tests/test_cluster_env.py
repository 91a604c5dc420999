"""``--on ray|slurm|k8s --env run``: the run's environment rebuilt and proven on the node.

The cheap cases (no training, no cluster: small real wheels from ``tests/pyenv_wheels.py``,
uv offline) run the node's own code as a job does:

* two jobs rebuilding the same environment into one shared folder at once both get the
  whole, proven venv (built in a temporary folder and renamed), and a third reuses it;
* a planted other-build (a file of an installed distribution edited in the shared venv) is
  named by distribution in the node's line;
* a distribution no source serves is named and nothing runs;
* a bundle that asks for the run's environment runs its command with the rebuilt venv's
  ``python`` and brings the node's proof back in its result;
* the Kubernetes Job gets an init container that rebuilds into a volume, unless the pods
  run the image the run recorded.

The end-to-end re-runs on a real Ray cluster and a real SLURM are in
``tests/test_cluster_ray.py`` and ``tests/test_cluster_slurm.py``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from manifest.errors import NoVerdictError
from manifest.models import Manifest
from manifest.rerun.environment import (
    ON_NODE,
    NodeEnvironmentError,
    NodeRebuild,
    RebuildOptions,
    for_cluster,
    jobs_environment,
    nodes_environment,
    on_node,
)
from manifest.trust import TrustDecision
from tests.pyenv_wheels import install, manifest_recording, standard_wheels

pytest.importorskip("uv", reason="the rebuild extra (uv) is not installed")

UNTRUSTED = TrustDecision(False, "not sealed here", "refused")
IDENTICAL = "the run's environment (rebuilt, files identical)"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Manifest, Path]:
    """A manifest recording two small distributions, and the folder of their wheels."""
    base = tmp_path_factory.mktemp("node-env")
    wheels = standard_wheels(base / "wheels")
    site = install(base / "venv", list(wheels.values()))
    return manifest_recording(site), base / "wheels"


def _request(recorded: tuple[Manifest, Path], tree: Path, cache: Path | None = None,
             wheels: Path | None = None) -> NodeRebuild:
    manifest, folder = recorded
    used, request = for_cluster(manifest, RebuildOptions(find_links=(str(wheels or folder),)),
                                trust=UNTRUSTED, tree=tree)
    assert used.line == ON_NODE and used.python is None and used.request == request
    return NodeRebuild.from_json(dict(request.to_json(), cache=str(cache) if cache else None))


_JOB = """\
import json, sys
from pathlib import Path
from manifest.rerun.environment import NodeRebuild, on_node
used = on_node(NodeRebuild.from_json(json.loads(sys.argv[1])), tree=Path(sys.argv[2]))
sys.stdout.write(json.dumps(used.to_json()))
"""


def test_jobs_at_once_share_one_whole_venv_then_a_planted_other_build_is_named(
        recorded: tuple[Manifest, Path], tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "envs"
    request = _request(recorded, tmp_path, shared)
    doc = json.dumps(request.to_json())
    jobs = [subprocess.Popen([sys.executable, "-c", _JOB, doc, str(tmp_path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = []
    for job in jobs:
        out, err = job.communicate(timeout=600)
        assert job.returncode == 0, err
        results.append(json.loads(out))
    assert [r["line"] for r in results] == [IDENTICAL, IDENTICAL]
    assert all(r["proof"]["proven"] for r in results)
    assert results[0]["venv"] == results[1]["venv"]  # one environment, wherever it was built
    assert Path(results[0]["venv"]).parent == shared
    assert [p.name for p in shared.iterdir()] == [Path(results[0]["venv"]).name]  # no debris
    again = on_node(request, tree=tmp_path)  # the next job reuses it
    assert again.cached and again.line == IDENTICAL

    # someone edits an installed file of alpha in the shared venv: same version, other files
    planted = next(Path(results[0]["venv"]).glob("lib/python*/site-packages/alpha/__init__.py"))
    planted.write_text("X = 2\n")
    edited = on_node(request, tree=tmp_path)
    assert edited.cached and edited.python is not None
    assert edited.line == ("the run's environment, rebuilt but not proven (not proven: 1 of 2 "
                           "identical, 1 other-build: alpha 1.0 other-build)"), edited.line
    assert edited.proof is not None and not edited.proof["proven"]


def test_a_distribution_no_source_serves_is_named_and_nothing_is_built(
        recorded: tuple[Manifest, Path], tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    request = _request(recorded, tmp_path, tmp_path / "envs", wheels=empty)
    with pytest.raises(NodeEnvironmentError) as caught:
        on_node(request, tree=tmp_path)
    assert isinstance(caught.value, NoVerdictError)  # exit 3: no verdict
    assert "could not be rebuilt" in caught.value.message
    assert "alpha 1.0" in caught.value.message and "beta-lib 2.0+cpu" in caught.value.message
    assert not (tmp_path / "envs").exists() or not any((tmp_path / "envs").iterdir())
    # a folder the node cannot see is one sentence too, not a traceback
    gone = NodeRebuild.from_json(dict(request.to_json(), find_links=[str(tmp_path / "nope")]))
    with pytest.raises(NodeEnvironmentError, match=r"could not be rebuilt on .*not a folder"):
        on_node(gone, tree=tmp_path)


def test_a_bundle_runs_its_command_with_the_rebuilt_python_and_returns_the_proof(
        recorded: tuple[Manifest, Path], tmp_path: Path) -> None:
    from manifest.rerun.cluster.bundle import build_bundle

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "where.py").write_text(
        "import os, sys\nimport alpha\n"
        "open(os.environ['WHERE_OUT'] + '/prefix.txt', 'w').write(sys.prefix)\n")
    out = tmp_path / "writable"
    out.mkdir()
    request = _request(recorded, tmp_path, tmp_path / "envs")
    settings = {"seed": 0, "derivation": "same", "threads": 1, "deterministic": True,
                "trail": "off", "ops": None, "root": str(tree), "hashseed": None}
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["WHERE_OUT"] = str(out)
    bundle = build_bundle(tmp_path / "bundle", tree=tree, cwd=tree, mount_at=tree,
                          argv=["python", "where.py"], outputs=[], patch=None, commit=None,
                          diff_digest=None, settings=settings, env=env, writable=[out],
                          sandbox=False, environment=request.to_json())
    index = json.loads((bundle.path / "bundle.json").read_text())
    assert index["environment"]["find_links"] == list(request.find_links)  # in its name
    done = subprocess.run([sys.executable, "-I", "-m", "manifest.rerun.remote",
                           str(bundle.path), str(tmp_path / "job"), "--expect", bundle.name],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads((tmp_path / "job" / "result.json").read_text())
    used = doc["environment"]
    assert used["line"] == IDENTICAL and used["proof"]["proven"] and used["node"]
    prefix = base64.b64decode(doc["writable"][0]["prefix.txt"]).decode()
    assert Path(prefix) == Path(used["venv"])  # the rebuilt venv's python ran the command
    assert Path(prefix) != Path(sys.prefix)  # positive control: not this interpreter's
    # the node probed the environment the command ran in: the rebuilt venv's distributions
    assert doc["probe"]["node"] == used["node"]
    assert {"alpha", "beta-lib"} <= set(doc["probe"]["env"]["packages"])
    # the report's line, from one node or from two that disagree
    assert (nodes_environment([used]) or {})["line"] == IDENTICAL
    other = dict(used, line="the run's environment, rebuilt but not proven (…)", node="n2",
                 proof=dict(used["proof"], proven=False))
    both = nodes_environment([used, other])
    assert both is not None and both["line"].startswith(f"node 0 ({used['node']}): ")
    assert "node 1 (n2): the run's environment, rebuilt but not proven" in both["line"]
    assert [n["proven"] for n in both["nodes"]] == [True, False]


def test_explains_runs_each_say_their_environment_where_they_differ() -> None:
    same = {"used": "run", "line": IDENTICAL, "venv": "/shared/envs/x"}
    assert jobs_environment([{"run": "A"}]) is None  # no job rebuilt one
    assert jobs_environment([{"run": "A", "environment": same},
                             {"run": "B", "environment": same}]) == same
    other = dict(same, line="the run's environment, rebuilt but not proven (…)")
    both = jobs_environment([{"run": "A", "environment": same},
                             {"run": "B", "environment": other}])
    assert both is not None and both["line"] == (
        f"A: {IDENTICAL}; B: the run's environment, rebuilt but not proven (…)")


def test_the_k8s_job_rebuilds_in_an_init_container_unless_it_runs_the_recorded_image(
        recorded: tuple[Manifest, Path], tmp_path: Path) -> None:
    pytest.importorskip("kubernetes", reason="the k8s extra is not installed")
    from manifest.rerun.cluster.k8s import ENV_MOUNT, KubernetesExecutor, as_documents, render
    from manifest.rerun.cluster.options import K8sOptions

    request = _request(recorded, tmp_path).to_json()
    image = "registry.example/train@sha256:" + "a" * 64
    executor = KubernetesExecutor(K8sOptions(on="k8s", image=image, environment=request))
    assert executor.recorded_image() is None  # the run recorded no image
    assert executor.environment_request() == dict(request, cache=ENV_MOUNT)
    _, job = as_documents(render(name="m", bundle_name="blake3:" + "b" * 64, image=image,
                                 namespace="default", nodes=1, threads=1, gpus=0,
                                 claim="pvc", rebuild=True))
    spec = job["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    assert init["name"] == "rebuild-environment"
    assert init["command"][2:5] == ["-m", "manifest.rerun.remote", "/bundle/" + "b" * 64]
    assert init["command"][-3:] == ["--env-only", "--env-cache", ENV_MOUNT]
    assert {"name": "environment", "emptyDir": {}} in spec["volumes"]
    [rerun] = spec["containers"]
    assert rerun["command"][-2:] == ["--env-cache", ENV_MOUNT]
    assert {"name": "environment", "mountPath": ENV_MOUNT} in rerun["volumeMounts"]
    _, plain = as_documents(render(name="m", bundle_name="blake3:" + "b" * 64, image=image,
                                   namespace="default", nodes=1, threads=1, gpus=0,
                                   claim="pvc"))
    assert "initContainers" not in plain["spec"]["template"]["spec"]  # control

    # the run recorded this image: the image is its environment, nothing is rebuilt
    env = dict(request["env"], container=dict(request["env"]["container"], image_digest=image))
    same = KubernetesExecutor(K8sOptions(on="k8s", image=image,
                                         environment=dict(request, env=env)))
    assert same.recorded_image() == image and same.environment_request() is None


def _env_drift_paths(recorded: Manifest, env: dict[str, Any]) -> set[str]:
    from manifest.capture.snapshot import probe_machine
    from manifest.verify.drift import environment_drift

    _, hardware, facts = probe_machine()
    return {d.path for d in environment_drift(recorded, (env, hardware, facts))
            if d.path.startswith("env.packages[")}


def test_the_drift_of_an_on_node_rerun_is_the_nodes_environment_not_this_machines(
        recorded: tuple[Manifest, Path], tmp_path: Path) -> None:
    """The node probes the rebuilt venv's python (``--env run``): the run's distributions do
    not drift although this machine has neither; a node without ``--env run`` probes its
    own python, which lacks them, and that drift is shown, said to be the node's."""
    from manifest.canonical import seal, to_document
    from manifest.capture.snapshot import probe_machine
    from manifest.rerun.cluster.node_env import checked_probes, probe_on_node
    from manifest.verify.drift import drift_on_nodes, environment_drift
    from manifest.verify.report import VerifyReport

    used = on_node(_request(recorded, tmp_path, tmp_path / "envs"), tree=tmp_path)
    rebuilt = probe_on_node(used)
    doc = to_document(recorded[0])  # the run's packages: those the rebuilt venv holds
    doc["env"] = dict(doc["env"], packages=rebuilt["env"]["packages"])
    manifest = seal({k: v for k, v in doc.items() if k not in ("run_id", "digest")})
    plain = probe_on_node(None)  # the cluster's python: this interpreter, without alpha
    assert rebuilt["node"] == plain["node"] == os.uname().nodename
    ran_with = probe_on_node(None, {"PYTHONHASHSEED": "0", "HOME": "/root"})["env"]
    assert ran_with["variables"] == {"PYTHONHASHSEED": "0"}  # the re-run's, allow-listed
    machine = probe_machine()
    here = _env_drift_paths(manifest, machine[0])
    assert here, "positive control: this machine's python has neither distribution"
    assert _env_drift_paths(manifest, rebuilt["env"]) == set()
    assert _env_drift_paths(manifest, plain["env"]) == here

    def verify_report(probes: list[dict[str, Any]], environment: dict[str, Any] | None
                      ) -> VerifyReport:
        report = VerifyReport(file="m.json", run_id=manifest.run_id, command=[])
        report.drift = environment_drift(manifest, machine)  # as verify takes it first
        report.environment = environment
        checked = checked_probes({"probes": probes}, "the ray job j")
        assert checked is not None
        drift_on_nodes(manifest, report, machine, checked)
        return report

    node = os.uname().nodename
    run = verify_report([rebuilt], dict(used.to_json(), node=node))
    assert not {d.path for d in run.drift if d.path.startswith("env.packages[")}
    assert run.environment is not None
    assert run.environment["line"] == (f"{IDENTICAL}; the drift shown is node {node}'s, "
                                       "where the re-run ran, not this machine's")
    shown = verify_report([plain], {"used": "here", "line": "this machine's: …"})
    assert {d.path for d in shown.drift} >= here  # the node's python lacks them too
    assert shown.environment is not None
    assert shown.environment["line"].startswith(f"node {node}'s: 2 distributions differ; ")
    assert shown.environment["line"].endswith(f"the drift shown is node {node}'s, where the "
                                              "re-run ran, not this machine's")
    # two nodes that differ: what they share once, the rest named by node
    other = dict(plain, node="n2")
    both = verify_report([rebuilt, other], dict(used.to_json(), node=node))
    per_node = [d.reason for d in both.drift if d.path.startswith("env.packages[")]
    assert per_node and all(r.startswith("node 1 (n2): ") for r in per_node)
    assert both.environment is not None
    assert f"the nodes' ({node}, n2)" in both.environment["line"]

    # explain: each run a job; the first job's probes replace the drift once, and the line
    # the later jobs rebuild says whose drift it is again
    from manifest.verify.drift import drift_of_jobs

    explained = VerifyReport(file="m.json", run_id=manifest.run_id, command=[])
    explained.drift = environment_drift(manifest, machine)
    checked = checked_probes({"probe": rebuilt}, "the slurm job 8")
    assert checked is not None
    jobs: list[dict[str, Any]] = []
    for label in ("A", "B"):
        jobs.append({"run": label, "probes": checked})
        explained.environment = dict(used.to_json(), node=node)  # as jobs_environment does
        drift_of_jobs(manifest, explained, jobs[-1], jobs)
        assert explained.drift == run.drift and "probes" not in jobs[-1]
        assert explained.environment["line"] == run.environment["line"]


def test_the_nodes_hardware_replaces_this_machines_in_the_drift(
        recorded: tuple[Manifest, Path]) -> None:
    """The node sends its hardware section with its env: a run recorded on two H100s,
    re-run on a node that has them, shows no GPU drift although this machine has none; a
    node that sends no hardware section (an older torch-manifest) leaves this machine's
    hardware lines, and the environment line says so (the control)."""
    from manifest.canonical import seal, to_document
    from manifest.capture.snapshot import probe_machine
    from manifest.rerun.cluster.node_env import checked_probes, probe_on_node
    from manifest.verify.drift import drift_on_nodes, environment_drift
    from manifest.verify.report import VerifyReport

    machine = probe_machine()
    node = probe_on_node(None)
    assert "hardware" in node
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85520809984,
             "compute_capability": "9.0", "mig_mode": False, "ecc_mode": True}
            for i in range(2)]
    h100s = dict(node["hardware"], gpus=gpus, gpu_count=2, gpu_driver="580.95.05")
    doc = to_document(recorded[0])
    doc["hardware"] = dict(doc["hardware"], gpus=gpus, gpu_count=2, gpu_driver="580.95.05")
    manifest = seal({k: v for k, v in doc.items() if k not in ("run_id", "digest")})

    def gpu_drift(probe: dict[str, Any]) -> tuple[set[str], str]:
        report = VerifyReport(file="m.json", run_id=manifest.run_id, command=[])
        report.drift = environment_drift(manifest, machine)
        checked = checked_probes({"probes": [probe]}, "the slurm job 9")
        assert checked is not None
        drift_on_nodes(manifest, report, machine, checked)
        assert report.environment is not None
        return ({d.path for d in report.drift if d.path.startswith("hardware.gpu")},
                str(report.environment["line"]))

    here, line = gpu_drift({k: v for k, v in node.items() if k != "hardware"})
    assert here, "control: without the node's hardware, this machine's lines stay"
    assert line.endswith("(its hardware lines are this machine's: the node sent no "
                         "hardware section)")
    there, line = gpu_drift(dict(node, hardware=h100s))
    assert there == set() and "hardware lines" not in line
    with pytest.raises(NoVerdictError, match="hardware"):
        checked_probes({"probes": [dict(node, hardware={"gpus": "many"})]}, "the job")


@pytest.mark.parametrize(("probes", "why"), [
    ([{"node": "n1", "env": {"python": 3}}], "node 0: python"),
    ([{"env": {}}], "node 0: no node name"),
    ([{"node": "n\x1b[2J", "env": {}}], "node 0: no node name"),
    ({"node": "n1"}, "not a list of nodes"),
    ([{"node": "n1", "env": {"python": "x" * (5 << 20)}}], "more than"),
])
def test_a_hostile_node_probe_is_refused_in_one_sentence(
        probes: Any, why: str) -> None:
    from manifest.capture.snapshot import probe_machine
    from manifest.rerun.cluster.node_env import checked_probes

    good = {"node": "n1", "env": probe_machine()[0]}
    assert checked_probes({"probe": good}, "the slurm job 7") == [good]  # positive control
    assert checked_probes({}, "the slurm job 7") is None  # a node that sent none
    with pytest.raises(NoVerdictError) as caught:
        checked_probes({"probes": probes}, "the slurm job 7")
    message = caught.value.message
    assert message.startswith("the slurm job 7 returned an environment probe that is not one")
    assert why in message and "\n" not in message and len(message) < 400
