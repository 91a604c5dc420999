"""Each executor owns its options: one registry row each, tied to the CLI, pyproject and docs.

A fourth executor is one module and one row in ``manifest.rerun.cluster.options.REGISTRY``;
these tests fail when the ``--on`` choices, the flags, the extras or the docs' executor
tables disagree with the rows, and they hold that another executor's flag or
``[tool.manifest.executors.X]`` key is refused in one sentence (with controls).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest

from manifest.errors import ConfigError, UsageError
from manifest.rerun.cluster.options import (
    EXECUTORS,
    REGISTRY,
    ClusterOptions,
    K8sOptions,
    RayOptions,
    SlurmOptions,
    cluster_options,
)

REPO = Path(__file__).resolve().parents[1]


def _verify_parser() -> argparse.ArgumentParser:
    from manifest.cli.app import build_parser

    parser = build_parser(["verify", "run.json"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    verify: argparse.ArgumentParser = sub.choices["verify"]
    return verify


def test_the_on_choices_are_the_registry_rows() -> None:
    on = next(a for a in _verify_parser()._actions if a.dest == "on")
    assert list(on.choices or []) == ["local", *REGISTRY]
    assert tuple(REGISTRY) == EXECUTORS


def test_every_options_flag_is_a_flag_of_the_verb_with_that_dest() -> None:
    by_dest = {a.dest: a.option_strings for a in _verify_parser()._actions}
    records: list[type[ClusterOptions]] = [ClusterOptions,
                                           *(row.options for row in REGISTRY.values())]
    for options in records:
        own = {f.name for f in fields(options)}
        for name, flag in options.FLAGS.items():
            assert name in own, (options.__name__, name)
            assert flag in by_dest.get(name, []), (options.__name__, name, flag)


def test_every_row_has_its_extra_in_pyproject_and_in_the_docs_tables() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    readme = (REPO / "README.md").read_text()
    cluster_page = (REPO / "docs" / "cluster.md").read_text()
    for on, row in REGISTRY.items():
        assert row.extra in extras, on
        library = row.library.partition(".")[0]
        assert any(library in dep or row.extra in dep for dep in extras[row.extra]), on
        assert f"torch-manifest[{row.extra}]" in readme, on
        assert f"--on {on}" in readme, on
        assert f"torch-manifest[{row.extra}]" in cluster_page, on
        from manifest.errors import EXTRA_OF_MODULE

        assert EXTRA_OF_MODULE[library] == row.extra, on  # the CLI's own install sentence
        dev_self = next(d for d in extras["dev"] if d.startswith("torch-manifest["))
        assert row.extra in dev_self.partition("[")[2].rstrip("]").split(","), on


def test_each_row_names_an_executor_class_and_its_options() -> None:
    import importlib

    for on, row in REGISTRY.items():
        module, _, name = row.executor.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(row.options, ClusterOptions)
        assert row.options is not ClusterOptions, on
        options = cluster_options(on, {}, {})
        assert type(options) is row.options and options.on == on
        executor = cls(options)
        assert executor.name == on


def test_another_executors_flag_is_refused_and_its_own_is_taken() -> None:
    with pytest.raises(UsageError, match=r"^--partition is an option of --on slurm, not of "
                                         r"--on ray\.$"):
        cluster_options("ray", {"partition": "gpu", "address": None}, {})
    with pytest.raises(UsageError, match=r"^--claim is an option of --on k8s, not of --on "
                                         r"slurm\.$"):
        cluster_options("slurm", {"claim": "pvc"}, {})
    # controls: the owner takes it; flags not given (None/False) are no refusal
    slurm = cluster_options("slurm", {"partition": "gpu", "claim": None, "dry_run": False}, {})
    assert isinstance(slurm, SlurmOptions) and slurm.partition == "gpu"
    k8s = cluster_options("k8s", {"claim": "pvc", "dry_run": True}, {})
    assert isinstance(k8s, K8sOptions) and k8s.claim == "pvc" and k8s.prints_only
    # a common option is every executor's
    for on in EXECUTORS:
        assert cluster_options(on, {"timeout_s": 5}, {}).timeout_s == 5


def test_another_executors_config_key_is_refused_with_its_owner() -> None:
    with pytest.raises(ConfigError, match=r"^\[tool\.manifest\.executors\.ray\] has "
                                          r"'claim', an option of k8s, not of ray\.$"):
        cluster_options("ray", {}, {"ray": {"partition": "gpu", "claim": "pvc"}})
    with pytest.raises(ConfigError, match=r"has 'partition', an option of slurm, not of ray"):
        cluster_options("ray", {}, {"ray": {"partition": "gpu"}})
    with pytest.raises(ConfigError, match=r"unknown key 'adress' \(did you mean 'address'\?\)"):
        cluster_options("ray", {}, {"ray": {"adress": "http://h:8265"}})
    with pytest.raises(ConfigError, match=r"unknown key 'zzz'\.$"):
        cluster_options("slurm", {}, {"slurm": {"zzz": 1}})
    ray = cluster_options("ray", {}, {"ray": {"address": "http://h:8265"},
                                      "slurm": {"partition": "gpu"}})
    assert isinstance(ray, RayOptions) and ray.address == "http://h:8265"


def test_a_gpu_map_must_be_names_to_strings() -> None:
    with pytest.raises(ConfigError, match="gpu_types must be a table"):
        cluster_options("slurm", {}, {"slurm": {"gpu_types": {"NVIDIA H100": 3}}})
    slurm = cluster_options("slurm", {}, {"slurm": {"gpu_types": {"NVIDIA H100": "hopper"}}})
    assert isinstance(slurm, SlurmOptions) and slurm.gpu_types == {"NVIDIA H100": "hopper"}


def test_the_cli_refuses_another_executors_flag_in_one_sentence(tmp_path: Path) -> None:
    run = REPO / "tests" / "golden" / "manifest_v1.json"
    proc = subprocess.run(
        [sys.executable, "-m", "manifest", "verify", str(run), "--on", "ray",
         "--address", "http://127.0.0.1:1", "--partition", "gpu"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "--partition is an option of --on slurm, not of --on ray." in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr


def test_the_verbs_own_fields_are_no_user_option_and_progress_is_never_printed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``environment`` and ``note`` are set by the verb: a config key of that name is
    refused like any unknown one; an executor nobody gave a ``note`` keeps its progress
    (returned in ``job["notes"]``) and writes nothing."""
    with pytest.raises(ConfigError, match="unknown key 'environment'"):
        cluster_options("slurm", {}, {"slurm": {"environment": {"env": {}}}})
    from manifest.rerun.cluster.remote_run import ClusterExecutor

    quiet = ClusterExecutor(cluster_options("slurm", {}, {}))
    quiet.note("slurm job 1 submitted")
    assert quiet.notes == ["slurm job 1 submitted"]
    heard: list[str] = []  # control: a note given is where the sentences go, as they happen
    told = ClusterExecutor(cluster_options("slurm", {}, {}), note=heard.append)
    told.note("slurm job 2 submitted")
    assert heard == ["slurm job 2 submitted"] and told.notes == []
    assert capsys.readouterr() == ("", "")


def test_several_runs_cannot_be_a_dry_run_in_one_sentence(tmp_path: Path) -> None:
    pytest.importorskip("kubernetes", reason="the k8s extra is not installed")
    run = REPO / "tests" / "golden" / "manifest_v1.json"
    for verb, extra in (("explain", ()), ("verify", ("--segments", "2"))):
        proc = subprocess.run(
            [sys.executable, "-m", "manifest", verb, str(run), "--on", "k8s", "--dry-run",
             "--claim", "pvc", *extra],
            capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False)
        assert proc.returncode == 2, (verb, proc.stderr)
        assert "--dry-run prints the one Job a verify would submit" in proc.stderr, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and not proc.stdout, proc.stderr
    # control: verify's one run may be a dry run (whatever it says next, not this)
    proc = subprocess.run(
        [sys.executable, "-m", "manifest", "verify", str(run), "--on", "k8s", "--dry-run",
         "--claim", "pvc"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
        check=False)
    assert "--dry-run prints the one Job" not in proc.stderr, proc.stderr
