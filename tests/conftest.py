"""Shared fixtures: real git repositories, a fake of NVML, and the CLI in a subprocess.

* Repositories are real (``git init`` in ``tmp_path``), built with git's own
  commands and an isolated configuration (``HOME`` points into the test's tmp
  dir, no system or global config), so what the probes see is what a user's
  repository looks like, not a mock of it.
* :class:`FakeNvml` mimics the part of ``pynvml`` that
  ``manifest.probes.hardware`` calls; tests using it are marked
  ``@pytest.mark.fake_gpu``. Tests marked ``@pytest.mark.gpu`` need a real
  driver and are skipped when NVML cannot initialise here.
* :func:`run_cli` runs ``python -m manifest.cli`` as a user would, so exit
  status, stdout and stderr are checked end to end.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
GIT_IDENTITY = ("-c", "user.name=Test User", "-c", "user.email=test@example.invalid")


# ------------------------------------------------------------------ GPU marks


def _real_nvml_available() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    try:
        count: int = pynvml.nvmlDeviceGetCount()
        return count > 0
    finally:
        pynvml.nvmlShutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not _real_nvml_available():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU and driver (NVML)")
        for item in gpu_items:
            item.add_marker(skip)
    astray = sorted({item.nodeid.split("::", 1)[0] for item in items
                     if item.get_closest_marker("cluster") is not None
                     and not item.nodeid.startswith(CLUSTER_MODULES)})
    if astray:
        raise pytest.UsageError(
            f"{', '.join(astray)}: a test marked cluster belongs in a {CLUSTER_MODULES}*.py "
            "module, where the parallel run keeps every cluster test on one worker")


# ------------------------------------------------------- parallel runs (xdist)

CLUSTER_MODULES = "tests/test_cluster_"
"""Where the ``cluster`` tests live; under xdist one worker runs these modules, in turn.

A Ray cluster (a head, a second raylet and their daemons) or a SLURM job each keep CI's
2 cores busy, so two at once would race their timeouts; and the single real SLURM
(``tests.slurm_host``) is started by whichever test first finds it down, which two
workers would otherwise do at the same time. (xdist's own ``xdist_group`` marks cannot
say this: pytest-xdist 3.8 tags a grouped test by rewriting ``Item._nodeid``, which
pytest 9.2 no longer reads, so every mark is silently ignored.)"""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile`` (README's test command): each module on one worker, as
    xdist does, and the cluster modules (:data:`CLUSTER_MODULES`) all on the same one.

    By module, a module-scoped fixture (a capture with its envelope, up to a minute of
    training) is built once, not again on each worker that gets one of its tests.
    """
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class ModuleOrCluster(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "cluster" if nodeid.startswith(CLUSTER_MODULES) else nodeid.split("::", 1)[0]

    return ModuleOrCluster(config, log)


# ------------------------------------------------------------ user data dir


@pytest.fixture(scope="session", autouse=True)
def _isolated_data_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Captures record the digests they seal in the user's data directory
    (``manifest.trust``): point it into the session's tmp dir, for this
    process and every CLI subprocess, so tests never touch the real one."""
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg-data"))


# ----------------------------------------------------------------- git repos


def isolated_git_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for git and the CLI in tests: no user/system git config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
    })
    if extra:
        env.update(extra)
    return env


@dataclass
class GitRepo:
    """A real repository in a temporary directory, driven by the git program."""

    path: Path
    env: dict[str, str]

    def git(self, *args: str, cwd: Path | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            ["git", *GIT_IDENTITY, *args],
            cwd=cwd or self.path, env=self.env, capture_output=True, text=True, check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
        return proc.stdout.strip()

    def write(self, rel: str, content: str | bytes) -> Path:
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
        return target

    def commit(self, message: str = "change", *paths: str) -> str:
        self.git("add", "--", *(paths or (".",)))
        self.git("commit", "-q", "--no-verify", "-m", message)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD")


@dataclass
class RepoFactory:
    """Makes repositories under one test's tmp dir, all sharing an isolated HOME."""

    base: Path
    env: dict[str, str]
    made: list[GitRepo] = field(default_factory=list)

    def empty(self, name: str = "repo") -> GitRepo:
        path = self.base / name
        path.mkdir(parents=True)
        repo = GitRepo(path, self.env)
        repo.git("init", "-q", "-b", "main", ".")
        self.made.append(repo)
        return repo

    def with_commit(self, name: str = "repo") -> GitRepo:
        repo = self.empty(name)
        repo.write("train.py", "print('training')\n")
        repo.write("README.md", "# a project\n")
        repo.write(".gitignore", "*.log\n")
        repo.commit("initial")
        return repo


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME for this test (git reads no user config), also set in os.environ."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(path / ".config"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    return path


@pytest.fixture
def repos(tmp_path: Path, home: Path) -> RepoFactory:
    return RepoFactory(tmp_path / "repos", isolated_git_env(home))


@pytest.fixture
def repo(repos: RepoFactory) -> GitRepo:
    """A repository with one commit on ``main`` and a clean tree."""
    return repos.with_commit()


# ---------------------------------------------------------------------- NVML


class FakeNvmlError(Exception):
    """Stands in for ``pynvml.NVMLError``."""


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = 85_520_809_984
    capability: tuple[int, int] = (9, 0)
    mig: tuple[int, int] | None = (0, 0)
    ecc: tuple[int, int] | None = (1, 1)
    uuid: str = "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"
    # NVML's total-energy counter (mJ since the driver loaded); each read advances
    # it by energy_step_mj, as a busy GPU's would. None: the board does not expose it.
    energy_mj: int | None = 7_000_000
    energy_step_mj: int = 250_000


@dataclass
class _MemoryInfo:
    total: int
    free: int
    used: int


class FakeNvml:
    """The subset of ``pynvml`` that ``manifest.probes.hardware`` uses.

    ``fail_init`` makes ``nvmlInit`` raise (driver present but not loaded);
    a ``None`` MIG/ECC mode raises like NVML's NotSupported does on boards
    without the feature. ``calls`` records every call in order.
    """

    NVMLError = FakeNvmlError

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (FakeGpu(),),
        *,
        driver: str | bytes = "550.54.15",
        cuda_driver: int = 12040,
        fail_init: bool = False,
    ) -> None:
        self.gpus = list(gpus)
        self.driver = driver
        self.cuda_driver = cuda_driver
        self.fail_init = fail_init
        self.initialised = False
        self.calls: list[str] = []

    def _check(self, name: str) -> None:
        self.calls.append(name)
        if name not in ("nvmlInit", "nvmlShutdown") and not self.initialised:
            raise FakeNvmlError("Uninitialized")

    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        if self.fail_init:
            raise FakeNvmlError("Driver Not Loaded")
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_driver

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._check("nvmlDeviceGetHandleByIndex")
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> _MemoryInfo:
        self._check("nvmlDeviceGetMemoryInfo")
        return _MemoryInfo(total=handle.memory_bytes, free=handle.memory_bytes, used=0)

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability")
        return handle.capability

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> tuple[int, int]:
        self._check("nvmlDeviceGetMigMode")
        if handle.mig is None:
            raise FakeNvmlError("Not Supported")
        return handle.mig

    def nvmlDeviceGetEccMode(self, handle: FakeGpu) -> tuple[int, int]:
        self._check("nvmlDeviceGetEccMode")
        if handle.ecc is None:
            raise FakeNvmlError("Not Supported")
        return handle.ecc

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        self._check("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        self._check("nvmlDeviceGetTotalEnergyConsumption")
        if handle.energy_mj is None:
            raise FakeNvmlError("Not Supported")
        value = handle.energy_mj
        handle.energy_mj += handle.energy_step_mj
        return value


@pytest.fixture
def fake_nvml() -> FakeNvml:
    """Two H100s behind a fake NVML."""
    return FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-87654321-aaaa-bbbb-cccc-0123456789ab")])


# ----------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8")


def run_cli(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    timeout: float = 120,
) -> CliResult:
    """``python -m manifest.cli ARGS`` in ``cwd``; stdout as bytes, stderr as text."""
    proc = subprocess.run(
        [python, "-m", "manifest.cli", *args],
        cwd=cwd, env=dict(env) if env is not None else None,
        capture_output=True, check=False, timeout=timeout,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


@pytest.fixture
def cli_env(home: Path) -> dict[str, str]:
    """Environment for CLI subprocesses: isolated git config, manifest importable."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return isolated_git_env(home, {"PYTHONPATH": pythonpath})


def assert_one_sentence(stderr: str) -> None:
    """stderr is a single clear line from manifest, never a traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("manifest: "), stderr
    assert lines[0].rstrip().endswith((".", ")")), stderr
