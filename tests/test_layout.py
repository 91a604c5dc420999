"""README's "Layout" block names every module and package of ``manifest/``, and nothing else;
no module outgrows what a reader holds in mind (500 lines) without saying why."""

from __future__ import annotations

import ast
import logging
import os
import re
from pathlib import Path

import pytest

from manifest.nodes.layout import Layout, cluster_launch, local_launches, node_env
from manifest.nodes.torchrun import option
from tests.runs import REPO


def _layout_names() -> set[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    names = set()
    for line in block.splitlines()[2:]:
        match = re.match(r"\s+(\S+)", line)
        if match:
            names.add(match.group(1).rstrip("/"))
    return names


def test_readme_layout_matches_the_package() -> None:
    package = REPO / "manifest"
    present = {
        p.name for p in package.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists())
        or (p.suffix == ".py" and p.name != "__main__.py")
    }
    assert _layout_names() == present


def test_layers_point_down_only() -> None:
    """The core modules import no verb, and no verb imports the CLI."""
    core = ["errors", "models", "canonical", "schema", "config", "store", "gitrun"]
    upper = ("manifest.cli", "manifest.capture", "manifest.verify", "manifest.diff",
             "manifest.gate")
    for name in core:
        source = (REPO / "manifest" / f"{name}.py").read_text(encoding="utf-8")
        for target in upper:
            assert f"from {target}" not in source, f"{name}.py imports {target}"
    for package in ("capture", "verify", "diff", "gate", "data", "weights", "probes", "launch"):
        for path in (REPO / "manifest" / package).rglob("*.py"):
            assert "from manifest.cli" not in path.read_text(encoding="utf-8"), path


def _package_lines() -> dict[str, str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    lines = {}
    for line in block.splitlines()[2:]:
        match = re.match(r"\s+(\S+)/\s+(.*)", line)
        if match:
            lines[match.group(1)] = match.group(2)
    return lines


def test_each_package_line_names_its_modules() -> None:
    """A newcomer finds every module from the listing: a package's line names each one
    (``render*`` stands for the renderers)."""
    lines = _package_lines()
    missing = []
    for package, description in lines.items():
        for path in (REPO / "manifest" / package).rglob("*.py"):
            name = path.stem
            if name in ("__init__", "__main__") or (name.startswith("render")
                                                    and "render*" in description):
                continue
            if not re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", description):
                missing.append(f"{package}/{path.relative_to(REPO / 'manifest' / package)}")
    assert missing == []


MAX_LINES = 500
LONG_MARK = "Longer than 500 lines because"


def oversized(root: Path) -> list[str]:
    """Modules over :data:`MAX_LINES` whose docstring does not say why (``LONG_MARK``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > MAX_LINES and LONG_MARK not in (ast.get_docstring(ast.parse(text)) or ""):
            found.append(f"{path.relative_to(root)} ({lines} lines)")
    return found


def test_no_module_over_500_lines_unless_its_docstring_says_why(tmp_path: Path) -> None:
    assert oversized(REPO / "manifest") == []
    # Positive control: a long module is caught, and its reason lets it pass.
    (tmp_path / "long.py").write_text('"""A module."""\n' + "x = 1\n" * 600)
    assert oversized(tmp_path) == ["long.py (601 lines)"]
    (tmp_path / "long.py").write_text(f'"""A module. {LONG_MARK} ..."""\n' + "x = 1\n" * 600)
    assert oversized(tmp_path) == []


# ------------------------------------------- manifest.nodes.layout: the node launches

RECORDED = ["torchrun", "--nnodes=2", "--nproc-per-node=1", "--node-rank=1",
            "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "--rdzv-id=job",
            "--rdzv-conf=join_timeout=600,read_timeout=90", "train.py", "--node-rank", "7"]


def test_local_launches_give_each_node_its_rank_under_the_static_rendezvous() -> None:
    launches = local_launches(RECORDED, Layout(3, 2), 41977)
    assert [option(a, "node_rank") for a in launches] == ["0", "1", "2"]
    for argv in launches:
        assert option(argv, "rdzv_backend") == "static"  # the one honouring --node-rank
        assert option(argv, "rdzv_endpoint") == "127.0.0.1:41977"
        assert option(argv, "rdzv_id") == "job"
        assert option(argv, "nnodes") == "3" and option(argv, "nproc_per_node") == "2"
        # static reads `timeout` only; the recorded c10d keys are not carried
        assert option(argv, "rdzv_conf") == "timeout=120"
        assert option(argv, "master_addr") is None and option(argv, "standalone") is None
        assert argv[-3:] == ["train.py", "--node-rank", "7"]  # the script's own words
    kept = local_launches([*RECORDED[:7], "--rdzv-conf", " timeout = 30 ,x=1", "train.py"],
                          Layout(2, 1), 1)
    assert option(kept[0], "rdzv_conf") == "timeout=30"


@pytest.mark.parametrize("node", [0, 1, 2])
def test_torchrun_honours_each_local_launch_s_node_rank_without_a_warning(
        node: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """torchrun's own parsing of each launch: ``rank`` = the node's index goes to the
    rendezvous, and torchrun does not say it ignores ``--node-rank`` (under c10d it does,
    for every node but 0)."""
    run = pytest.importorskip("torch.distributed.run")
    for name in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    argv = local_launches(RECORDED, Layout(3, 2), 41977)[node]
    with caplog.at_level(logging.WARNING):
        config, _, _ = run.config_from_args(run.parse_args(argv[1:]))
    assert config.rdzv_backend == "static" and config.rdzv_endpoint == "127.0.0.1:41977"
    assert config.rdzv_configs["rank"] == node
    assert str(config.rdzv_configs["timeout"]) == "120"
    assert [r.getMessage() for r in caplog.records if "node_rank" in r.getMessage()] == []


def test_cluster_launch_is_the_static_rendezvous_with_a_timeout_on_every_node() -> None:
    """One command for every node: static rendezvous, the recorded `timeout` carried (the
    same on every node, so on the command), no node rank and no endpoint (node_env)."""
    argv = cluster_launch(RECORDED, Layout(2, 1))
    assert option(argv, "rdzv_backend") == "static" and option(argv, "rdzv_conf") == "timeout=120"
    assert option(argv, "node_rank") is None and option(argv, "rdzv_endpoint") is None
    assert option(argv, "rdzv_id") == "job" and argv[-3:] == ["train.py", "--node-rank", "7"]
    timed = [*RECORDED[:7], "--rdzv-conf=join_timeout=9,timeout=45", "train.py"]
    assert option(cluster_launch(timed, Layout(2, 1)), "rdzv_conf") == "timeout=45"
    for odd in ("timeout=1.5", "timeout=0", "timeout=", "timeout=-3"):  # torchrun's int()
        assert option(cluster_launch([*RECORDED[:7], f"--rdzv-conf={odd}", "t.py"],
                                     Layout(2, 1)), "rdzv_conf") == "timeout=120", odd
    assert node_env(1, "10.0.0.5", 29500) == {"PET_NODE_RANK": "1",
                                              "PET_RDZV_ENDPOINT": "10.0.0.5:29500"}


@pytest.mark.parametrize("node", [0, 1, 2])
def test_torchrun_honours_each_cluster_node_s_rank_without_a_warning(
        node: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """torchrun's own parsing of what a cluster node runs, cluster_launch's command with
    node_env's variables: ``rank`` = the node's index goes to the rendezvous, node 0's
    endpoint is the store's, and torchrun does not say it ignores the node rank (under c10d,
    PET_NODE_RANK as much as --node-rank, it does for every node but 0)."""
    run = pytest.importorskip("torch.distributed.run")
    for name in [k for k in os.environ if k.startswith("PET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name, value in node_env(node, "10.0.0.5", 29500).items():
        monkeypatch.setenv(name, value)
    timed = [*RECORDED[:7], "--rdzv-conf=join_timeout=9,timeout=45", "train.py"]
    argv = cluster_launch(timed, Layout(3, 2))
    with caplog.at_level(logging.WARNING):
        config, _, _ = run.config_from_args(run.parse_args(argv[1:]))
    assert config.rdzv_backend == "static" and config.rdzv_endpoint == "10.0.0.5:29500"
    assert config.rdzv_configs["rank"] == node
    assert str(config.rdzv_configs["timeout"]) == "45"
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (3, 3, 2)
    assert [r.getMessage() for r in caplog.records if "node_rank" in r.getMessage()] == []


def test_the_static_rendezvous_makes_node_0_the_store_s_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Who serves the rendezvous is rank 0's launch (``is_master = rank == 0``), so node_env
    need not say it (c10d needed ``is_host``); the store is at node 0's endpoint with the
    command's timeout. The handler is built as torchrun builds it, without connecting."""
    pytest.importorskip("torch.distributed.run")
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import create_rdzv_handler

    argv = cluster_launch(RECORDED, Layout(2, 1))
    for node in (0, 1):
        env = node_env(node, "10.0.0.5", 29500)
        assert not any("is_host" in v for v in env.values())
        handler = create_rdzv_handler(RendezvousParameters(
            backend="static", endpoint=env["PET_RDZV_ENDPOINT"], run_id="job", min_nodes=2,
            max_nodes=2, rank=int(env["PET_NODE_RANK"]),
            timeout=option(argv, "rdzv_conf").partition("=")[2]))  # type: ignore[union-attr]
        assert (handler.master_addr, handler.master_port) == ("10.0.0.5", 29500)  # type: ignore[attr-defined]
        assert handler.rank == node and handler.timeout.total_seconds() == 120  # type: ignore[attr-defined]
