"""What the re-run's processes get besides the plan's settings: their argv and environment.

* **argv**: the recorded argv, with withheld values (``<redacted:N>``) filled
  from ``MANIFEST_SECRET_N`` in the verb's own environment, never from the
  manifest; a missing one is refused with one sentence before anything runs.
* **environment**: today's, with the recorded numerics variables put back
  (``OMP_*``, ``CUBLAS_WORKSPACE_CONFIG`` …), without the ``MANIFEST_SECRET_N``
  values (they went into the argv only), and with the recorded code
  variables (``PYTHONPATH`` …) replayed where ``{repo}`` stands for the tree
  the command sees.
* **interpreter** (``--env run``): the run's own environment, rebuilt by uv and proven
  file by file (``manifest.pyenv``): its venv's ``bin`` goes first on ``PATH``, so the
  recorded ``python`` (or ``torchrun``) is the rebuilt one, as in an activated venv; the
  launcher (``manifest/launch/boot``, on ``PYTHONPATH``) is standard library only, so it
  runs in a venv that holds none of this tool's dependencies. Without it, the re-run uses
  this machine's environment, and the report says how many of the run's distributions
  differ here (``this_machine``). Drift is then taken from the rebuilt interpreter
  (``probe_env_in``): the environment the re-run used is the one compared.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifest.errors import NoVerdictError
from manifest.models import Manifest
from manifest.rerun.interpreter import private_pycache, probe_env_in

if TYPE_CHECKING:
    from manifest.rerun.cluster.options import ClusterOptions
    from manifest.rerun.workspace import Workspace
    from manifest.trust import TrustDecision


def argv_to_run(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The recorded argv with withheld values filled from ``MANIFEST_SECRET_N``."""
    from manifest.errors import UsageError
    from manifest.redact import MissingSecretsError, restore_argv

    try:
        return restore_argv(list(argv), os.environ)
    except MissingSecretsError as exc:
        raise UsageError(f"cannot re-run: {exc}.",
                         hint="Values are never read from the manifest.") from exc


def numerics_env(recorded: Manifest) -> dict[str, str]:
    """Today's environment with the recorded numerics variables put back
    (and without the ``MANIFEST_SECRET_N`` values, which went into the argv)."""
    from manifest.probes.env import NUMERICS_VARIABLES
    from manifest.redact import SECRET_ENV_PREFIX

    env = {k: v for k, v in os.environ.items()
           if k not in NUMERICS_VARIABLES and not k.startswith(SECRET_ENV_PREFIX)}
    env.update(recorded.env.variables)
    return env


def rerun_env(recorded: Manifest, tree_seen: Path) -> tuple[dict[str, str], list[str]]:
    """(the re-run's base environment, recorded code-path entries missing here).

    ``tree_seen`` is where the command sees the tree: the repository's own path
    when confined (the clone is mounted there), else the scratch clone.
    """
    from manifest.rerun.inputs import code_env

    env = numerics_env(recorded)
    replay, absent = code_env(recorded, tree_seen)
    if replay is not None:
        from manifest.capture.observed import CODE_ENV_VARS

        env = {k: v for k, v in env.items() if k not in CODE_ENV_VARS}
        env.update(replay)
    return env, absent


# ------------------------------------------------------------ the run's own environment


@dataclass(frozen=True)
class RebuildOptions:
    """``--env run``: re-run in the run's own Python environment, rebuilt by uv and proven
    (``manifest.pyenv``). Where wheels may come from besides the recorded sources (which
    count only when the manifest is trusted, as its command does)."""

    find_links: tuple[str, ...] = ()
    index_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunEnvironment:
    """The Python environment a re-run runs in, and the words the report gives it."""

    line: str
    """``the run's environment (rebuilt, files identical)``, ``this machine's: 3
    distributions differ`` …"""
    python: Path | None = None
    """The rebuilt venv's interpreter; None: this machine's (the verifier's) environment."""
    proof: dict[str, Any] | None = None
    """``manifest.pyenv.prove.Proof.to_json`` of a rebuild."""
    cached: bool = False
    request: NodeRebuild | None = None
    """``--on`` with ``--env run``: what each node rebuilds and proves (:func:`on_node`);
    ``python`` is then None here, and the job's result says what each node used."""

    @property
    def venv(self) -> Path | None:
        return self.python.parent.parent if self.python is not None else None

    @property
    def stops(self) -> bool:
        """``--env run`` and nothing was built (a vanished distribution): no re-run."""
        return self.python is None and self.request is None and self.proof is not None

    def on_cluster(self, options: ClusterOptions | None) -> ClusterOptions | None:
        """``options`` carrying this environment's node request (unchanged without one)."""
        if options is None or self.request is None:
            return options
        from dataclasses import replace

        return replace(options, environment=self.request.to_json())

    def to_json(self) -> dict[str, Any]:
        if self.request is not None:
            return {"used": "run", "line": self.line}
        return {"used": "run" if self.python is not None else "here", "line": self.line,
                **({"proof": self.proof, "cached": self.cached, "venv": str(self.venv)}
                   if self.proof is not None else {})}

    def apply(self, env: dict[str, str], tool: Path | None = None) -> dict[str, str]:
        """``env`` for a re-run in this environment: the venv's ``bin`` first on ``PATH`` (a
        recorded ``python``, ``torchrun`` … resolves there, as in an activated venv), and
        neither the verifier's venv nor the user's site-packages leaking in; ``tool``
        (:meth:`tool_folder`) last on ``PYTHONPATH``; ``PYTHONPYCACHEPREFIX`` a fresh
        private folder (``rerun.interpreter.private_pycache``)."""
        if self.venv is None:
            return env
        out = {k: v for k, v in env.items()
               if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME")}
        out["PATH"] = str(self.venv / "bin") + (os.pathsep + env["PATH"] if env.get("PATH")
                                                else "")
        out["VIRTUAL_ENV"] = str(self.venv)
        out["PYTHONNOUSERSITE"] = "1"
        out["PYTHONPYCACHEPREFIX"] = private_pycache()
        if tool is not None:
            out["PYTHONPATH"] = (env["PYTHONPATH"] + os.pathsep if env.get("PYTHONPATH")
                                 else "") + str(tool)
        return out

    def tool_folder(self, scratch: Path) -> Path:
        """A folder of links for the rebuilt venv, which holds only the run's distributions:
        this tool's package (a script that calls ``manifest.seed_everything`` imports it;
        the recipe needs nothing but the standard library and torch), and, when the venv has
        no blake3 of its own, this interpreter's (the launcher's step-trail and generator
        fingerprints are blake3; without it they are not recorded and the trails cannot be
        compared). Nothing else of this environment is visible there."""
        import importlib.util

        import manifest

        folder = scratch / "run-env-tool"
        folder.mkdir(parents=True, exist_ok=True)
        links = {"manifest": Path(manifest.__file__).resolve().parent}
        assert self.venv is not None
        own = any(self.venv.glob("lib/python*/site-packages/blake3-*.dist-info"))
        spec = importlib.util.find_spec("blake3") if not own else None
        if spec is not None and spec.submodule_search_locations:
            links["blake3"] = Path(next(iter(spec.submodule_search_locations))).resolve()
        for name, target in links.items():
            if not (folder / name).exists():
                os.symlink(target, folder / name)
        return folder


def rebuilt_environment(recorded: Manifest, options: RebuildOptions, *, trust: TrustDecision,
                        tree: Path, note: Callable[[str], None] | None = None,
                        cache_dir: Path | None = None) -> RunEnvironment:
    """The run's environment rebuilt and proven (``manifest.pyenv.rebuild``); ``python`` is
    None when nothing could be built (a distribution vanished), and ``line`` says why.
    ``cache_dir``: where rebuilt venvs are kept (default the user's cache; a cluster job
    names the shared or node-local folder, :func:`on_node`)."""
    from manifest.pyenv.rebuild import build_environment

    built = build_environment(recorded, trust=trust, find_links=options.find_links,
                              index_urls=options.index_urls, tree=tree, note=note,
                              cache_dir=cache_dir)
    proof = built.proof
    if proof.unexpected:
        line = (f"the run's environment is refused: its cached venv holds files no recorded "
                f"distribution installed ({proof.line()}); remove that venv to rebuild it")
    elif built.python is None:
        line = f"the run's environment could not be rebuilt ({proof.line()}: " + ", ".join(
            f"{f.name} {f.version}" for f in proof.differing()) + ")"
    elif proof.proven:
        line = "the run's environment (rebuilt, files identical)"
    else:
        line = f"the run's environment, rebuilt but not proven ({proof.line()}: " + ", ".join(
            f"{f.name} {f.version} {f.status.value}" for f in proof.differing()) + ")"
    return RunEnvironment(line, built.python, proof.to_json(), built.cached)


def refuse_untrusted(decision: TrustDecision) -> TrustDecision:
    """``decision`` when it allows running the manifest's code; else the one sentence of
    :class:`~manifest.errors.UntrustedManifestError`. ``--env run`` asks this first,
    before anything is rebuilt, built or probed: a rebuild may build an sdist (its build
    backend is code) and the probe starts the venv's python (its ``.pth`` files run, even
    under ``-I``), each as much the author's code as the command."""
    if decision.allowed:
        return decision
    from manifest.errors import UntrustedManifestError

    raise UntrustedManifestError(
        f"{decision.reason}, so its environment is not rebuilt either (--env run).",
        hint="Pass --trust to rebuild its environment and run its command anyway.")


def environment_for(recorded: Manifest, machine: tuple[dict[str, Any], Any, Any],
                    rebuild: RebuildOptions | None, *, tree: Path,
                    trust: Callable[[], TrustDecision],
                    note: Callable[[str], None] | None = None,
                    cluster: ClusterOptions | None = None
                    ) -> tuple[RunEnvironment, tuple[dict[str, Any], Any, Any]]:
    """The environment a verb's re-runs use, and the machine probe its drift is taken from:
    this machine's (``rebuild`` None), or the run's own rebuilt (``--env run``), whose
    proof ``note`` receives before anything trains and whose interpreter is probed. With
    nothing built (a distribution vanished) the machine probe is returned unchanged and the
    caller stops: ``python`` is None and ``line`` says why. verify and explain call this.
    With ``rebuild``, the trust decision comes first (:func:`refuse_untrusted`): an
    untrusted manifest is refused before anything is rebuilt, built or probed.
    With a ``cluster`` (``--on``) the records are checked here and each node rebuilds
    (:func:`for_cluster`; :meth:`RunEnvironment.on_cluster` gives the executor's options);
    the drift returned is this machine's until the nodes' probes replace it
    (``manifest.verify.drift.drift_on_nodes``)."""
    if rebuild is None:
        return this_machine(recorded, machine[0]), machine
    decision = refuse_untrusted(trust())
    if cluster is not None:
        used = for_cluster(recorded, rebuild, trust=decision, tree=tree)[0]
        if note is not None:
            note(f"{used.line} (--on {cluster.on} --env run)")
        return used, machine
    used = rebuilt_environment(recorded, rebuild, trust=decision, tree=tree, note=note)
    if note is not None:
        note(used.line)
    if used.python is None:
        return used, machine
    from dataclasses import replace

    from manifest.errors import NoVerdictError

    try:
        return used, (probe_env_in(used.python, machine[0]), machine[1], machine[2])
    except NoVerdictError as exc:  # this tool's own dependencies do not load in that Python
        return replace(used, line=f"{used.line}; the drift shown is this machine's "
                       f"({exc.message.rstrip('.')})"), machine


def in_environment(used: RunEnvironment | None, env: dict[str, str],
                   workspace: Workspace) -> tuple[dict[str, str], Workspace]:
    """A re-run's environment variables and workspace for ``used``: the rebuilt venv first
    on ``PATH``, and the venv and :meth:`RunEnvironment.tool_folder` bound read-only in the
    sandbox (a private ``/tmp`` would hide a venv under it). Unchanged for this machine's."""
    if used is None or used.venv is None:
        return env, workspace
    from dataclasses import replace

    tool = used.tool_folder(workspace.scratch)
    return used.apply(env, tool), replace(workspace, ro_binds=(
        *workspace.ro_binds, (used.venv, used.venv), (tool, tool)))


def this_machine(recorded: Manifest, today: Mapping[str, Any]) -> RunEnvironment:
    """The verifier's own environment, against the run's distributions (those the run
    imported, with torch and its CUDA libraries): how many differ, by files or version."""
    from manifest.pyenv.sources import normalise, rebuild_set

    recorded_dists = recorded.env.distributions
    if not recorded_dists:
        return RunEnvironment("this machine's (the run did not record its distributions by "
                              "content)")
    here = {normalise(k): v for k, v in (today.get("distributions") or {}).items()}
    names = rebuild_set(recorded_dists, recorded.env.imported)
    wanted = {normalise(k): v for k, v in recorded_dists.items()}
    differ = 0
    for name in names if names is not None else sorted(wanted):
        was, now = wanted.get(name), here.get(name)
        if was is None:
            continue
        same = now is not None and now.get("version") == was.version and (
            now.get("files") == was.files)
        differ += not same
    if not differ:
        return RunEnvironment("this machine's: the run's distributions, files identical")
    return RunEnvironment(f"this machine's: {differ} distribution"
                          + (" differs" if differ == 1 else "s differ"))


# ------------------------------------------------------------ the run's environment on a node


@dataclass(frozen=True)
class NodeRebuild:
    """``--on ray|slurm|k8s --env run``: what a node needs to rebuild the run's environment
    itself, shipped in the bundle's index (whose name the node checks, so it is the
    submitter's): the recorded ``env`` section, the sources the user gave, and the trust
    decision made here (recorded sources count only when the manifest is trusted, exactly
    as for a rebuild here: ``manifest.pyenv.sources``). ``cache`` is where the node keeps
    rebuilt venvs: the shared folder (SLURM), else the node's own cache (None)."""

    env: dict[str, Any]
    find_links: tuple[str, ...]
    index_urls: tuple[str, ...]
    trust: dict[str, Any]
    cache: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"env": self.env, "find_links": list(self.find_links),
                "index_urls": list(self.index_urls), "trust": self.trust,
                "cache": self.cache}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> NodeRebuild:
        return cls(dict(doc["env"]), tuple(str(f) for f in doc.get("find_links") or ()),
                   tuple(str(u) for u in doc.get("index_urls") or ()), dict(doc["trust"]),
                   str(doc["cache"]) if doc.get("cache") else None)


ON_NODE = "the run's environment, rebuilt and proven where the job runs"
"""The report's line until a job's result says what each node used."""


def for_cluster(recorded: Manifest, options: RebuildOptions, *, trust: TrustDecision,
                tree: Path) -> tuple[RunEnvironment, NodeRebuild]:
    """``--env run`` with ``--on``: every recorded name, version, URL and source is checked
    here, before anything is submitted (a hostile record is one sentence, exit 2, as for a
    rebuild here); the rebuild itself and its proof happen on the node (:func:`on_node`)."""
    from manifest.pyenv.rebuild import recorded_pins
    from manifest.pyenv.sources import plan_sources

    pins = recorded_pins(recorded, tree)
    plan_sources(recorded.env.sources, find_links=options.find_links,
                 index_urls=options.index_urls, trust=trust, tree=tree, pins=pins)
    request = NodeRebuild(
        recorded.env.model_dump(mode="json"),
        tuple(str(Path(f).resolve()) for f in options.find_links), options.index_urls,
        {"allowed": trust.allowed, "reason": trust.reason, "basis": trust.basis})
    return RunEnvironment(ON_NODE, request=request), request


class NodeEnvironmentError(NoVerdictError):
    """The run's environment could not be rebuilt on a node (exit 3): the message says why,
    in the words a rebuild here gives; the job runs nothing and says so in its result."""


def on_node(request: NodeRebuild, *, tree: Path, cache_dir: Path | None = None
            ) -> RunEnvironment:
    """On the node, in the job: rebuild the run's environment and prove it there
    (:func:`rebuilt_environment`, the same code and sentences as ``verify --env run`` here),
    cached by the environment's key under ``cache_dir`` (the caller's), else
    ``request.cache``, else this node's user cache. A venv is built in a temporary folder
    beside the cache and renamed into place (``manifest.pyenv.cache``), so jobs that
    rebuild the same environment at once never see a half-built one. Raises
    :class:`NodeEnvironmentError` when nothing could be built (a vanished distribution,
    uv or the recorded Python missing on the node, a source the node cannot read)."""
    from manifest.errors import ManifestError
    from manifest.models import Env
    from manifest.trust import TrustDecision

    # A rebuild reads only the manifest's env section, the one part the bundle carries.
    only_env: dict[str, Any] = {"env": Env.model_validate(request.env)}
    recorded = Manifest.model_construct(**only_env)
    trust = TrustDecision(bool(request.trust.get("allowed")), str(request.trust.get("reason")),
                          str(request.trust.get("basis")))
    if cache_dir is not None:
        _own_folder(cache_dir)
    cache = cache_dir or (Path(request.cache) if request.cache else None)
    try:
        used = rebuilt_environment(recorded, RebuildOptions(request.find_links,
                                                            request.index_urls),
                                   trust=trust, tree=tree, cache_dir=cache)
    except ManifestError as exc:
        raise NodeEnvironmentError(f"the run's environment could not be rebuilt on "
                                   f"{os.uname().nodename}: {exc.message.rstrip('.')}"
                                   ) from exc
    if used.python is None:
        raise NodeEnvironmentError(f"{used.line} on {os.uname().nodename}")
    return used


def _own_folder(folder: Path) -> None:
    """Make ``folder``, a job's own environment folder (``--env-cache``: Kubernetes makes an
    ``emptyDir`` mode 0777), private (0700) when this user owns it: the cache refuses a
    folder others can write (``manifest.pyenv.cache.unsafe``) and would build elsewhere."""
    try:
        if folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid():
            folder.chmod(0o700)
    except OSError:
        pass  # then the cache says why it does not use it, and builds in a private folder


def nodes_environment(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The report's ``environment`` from each node's (``RunEnvironment.to_json`` with its
    ``node``): the first node's, with ``nodes`` listing each node's line, and one line that
    names a node whose environment differs from node 0's; None when no node rebuilt one."""
    envs = [dict(d) for d in docs if d]
    if not envs:
        return None
    first = envs[0]
    lines = [str(e.get("line")) for e in envs]
    line = lines[0] if len(set(lines)) == 1 else "; ".join(
        f"node {i} ({e.get('node')}): {e.get('line')}" for i, e in enumerate(envs))
    return {**first, "line": line,
            "used": "run" if all(e.get("used") == "run" for e in envs) else "here",
            "nodes": [{"node": e.get("node"), "line": e.get("line"),
                       "cached": e.get("cached"),
                       "proven": bool((e.get("proof") or {}).get("proven"))} for e in envs]}


def jobs_environment(jobs: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The report's ``environment`` for a verb that runs several jobs (explain's runs, each
    ``{"run": label, **job}``): the first job's, and where a later job's line differs, one
    line per run; None when no job rebuilt the run's environment."""
    used = [(str(j.get("run")), dict(j["environment"])) for j in jobs if j.get("environment")]
    if not used:
        return None
    first = used[0][1]
    lines = [env.get("line") for _, env in used]
    if len(set(lines)) == 1:
        return first
    return dict(first, line="; ".join(f"{run}: {env.get('line')}" for run, env in used),
                used="run" if all(env.get("used") == "run" for _, env in used) else "here")
