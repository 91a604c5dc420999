"""The remote entrypoint: ``python -I -m manifest.rerun.remote BUNDLE OUTDIR --expect NAME``.

Always started isolated (``-I``: no working directory or ``PYTHONPATH`` on
``sys.path``), so the code that checks a bundle is the installed package,
never a ``manifest/`` placed in the bundle that Ray uses as the working
directory; started with the bundle on ``sys.path``, it refuses before reading
the bundle (:func:`started_from`).

Every cluster executor (``manifest.rerun.cluster``: Ray, SLURM, Kubernetes)
runs this where the re-run runs, so arrival checks, the launcher and what
comes back are one piece of code:

1. check the bundle (``manifest.rerun.cluster.bundle.check_bundle``): its index
   is the one named ``NAME`` on the command line, its patch is the recorded
   one and its tree holds exactly the files indexed, each opened once without
   following a link and copied to ``OUTDIR/tree`` from the descriptor it was
   hashed from; otherwise refuse (exit 3) and run nothing;
2. with ``--env run`` (the index's ``environment``), rebuild the run's
   environment and prove it on this node (``manifest.rerun.environment.on_node``,
   cached under ``--env-cache`` or the folder the bundle names; ``--env-only``
   stops there, as a Kubernetes init container does); nothing runs when nothing
   could be built;
3. run the copy (the bundle stays as it arrived)
   the command there under the launcher, with the recorded settings and the
   environment delta the verb set (in the rebuilt venv when there is one);
   confined by bubblewrap when it works on this host (the bundle's
   ``--no-sandbox``/``--network`` carry over; with ``--require-sandbox`` a
   host without it refuses);
4. write ``OUTDIR/result.json``: the launcher's records, op streams, files
   opened (this host's paths as ``{tree}``), the per-tensor table of every
   declared output (``manifest.weights``: only the tables, so a checkpoint
   never travels back unless the bundle asks for it, ``--fetch-outputs``),
   the files written in the verb's writable directories, the confinement
   applied, and the environment used with its proof. ``--emit`` also prints
   it on stdout between marker lines (base64 of zlib), for executors that
   read results back from the job's log (Ray Jobs).

Exit status: the command's own, or 3 when the bundle was refused or the
host cannot honour ``--require-sandbox``. The verdict is never made here.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import zlib
from pathlib import Path
from typing import Any

RESULT = "result.json"
RESULT_FORMAT = "manifest-remote-result/v1"
BEGIN = "----- manifest result begin -----"
END = "----- manifest result end -----"
LINE = 76 * 1024
MAX_WRITABLE_BYTES = 256 << 20
"""What a run may write into a verb's writable directories (op streams, audits) and still
come back."""
RETURNED_ENV = ("CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "OMP_NUM_THREADS",
                "MKL_NUM_THREADS")
"""The only variables of the run's environment that come back (the verdict reads them)."""


def _fill(value: str, tree: Path, writable: list[Path],
          inputs: list[tuple[str, str]] | None = None) -> str:
    from manifest.rerun.cluster.bundle import TREE_TOKEN

    for i, path in enumerate(writable):
        value = value.replace(f"{{writable:{i}}}", str(path))
    for named, here in inputs or []:  # data shipped in the bundle, named by its recorded path
        if value == named or value.startswith(named + "/"):
            value = here + value[len(named):]
        elif "=" in value:  # --data=/data/x
            key, rest = value.split("=", 1)
            if rest == named or rest.startswith(named + "/"):
                value = f"{key}={here}{rest[len(named):]}"
    return value.replace(TREE_TOKEN, str(tree))


def _place_inputs(inputs: list[dict[str, Any]], tree: Path, outdir: Path
                  ) -> tuple[list[tuple[str, str]], list[tuple[Path, Path]]]:
    """Data outside the repository that travelled in the bundle (``inputs`` of the index):
    linked where a relative reference from the tree lands, when that stays inside
    ``outdir`` (and bound there read-only when confined: the sandbox shows only the tree);
    (recorded absolute path, where it is here) for the command line."""
    from manifest.errors import NoVerdictError

    placed: list[tuple[str, str]] = []
    binds: list[tuple[Path, Path]] = []
    for item in inputs:
        at = (tree / str(item["at"])).resolve()
        if not at.is_relative_to(tree.resolve()) or not at.exists():
            raise NoVerdictError(f"the bundle's data {item['at']!r} is not in its tree.")
        landing = item.get("landing")
        if landing:
            where = Path(os.path.normpath(tree / str(landing)))
            if (where.is_relative_to(outdir) and not where.is_relative_to(tree)
                    and not os.path.lexists(where)):
                where.parent.mkdir(parents=True, exist_ok=True)
                where.symlink_to(at)
                binds.append((at, where))
        if os.path.isabs(str(item["path"])):
            placed.append((str(item["path"]), str(at)))
    return placed, binds


def _files_under(directory: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    total = 0
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
            if total > MAX_WRITABLE_BYTES:
                break
            out[path.relative_to(directory).as_posix()] = base64.b64encode(
                path.read_bytes()).decode("ascii")
    return out


def run_bundle(bundle: Path, outdir: Path, expect: str, *, env_cache: Path | None = None,
               env_only: bool = False) -> dict[str, Any]:
    """Check, run and describe one bundle (the result document). A bundle that asks for the
    run's environment (``--env run``) has it rebuilt and proven here first
    (``manifest.rerun.environment.on_node``, cached under ``env_cache`` or the folder the
    bundle names); ``env_only`` stops there (a Kubernetes init container)."""
    from manifest.capture.run import digest_outputs
    from manifest.errors import NoVerdictError
    from manifest.launch.runner import LaunchSettings
    from manifest.rerun.cluster.bundle import TREE, check_bundle
    from manifest.rerun.executor import LocalExecutor
    from manifest.rerun.workspace import Workspace

    why = started_from(bundle)
    if why is not None:
        raise NoVerdictError(f"the arrival check would run code from the bundle: {why}; "
                             "start it as python -I -m manifest.rerun.remote.")
    outdir.mkdir(parents=True, exist_ok=True)
    tree = outdir / TREE
    if tree.exists():
        shutil.rmtree(tree)
    # Checked and copied in one pass, from the descriptors the hashes were taken from.
    index = check_bundle(bundle, expect, copy_to=tree)
    tree.mkdir(exist_ok=True)
    writable = [outdir / "writable" / str(i) for i in range(int(index["writable"]))]
    for path in writable:
        path.mkdir(parents=True, exist_ok=True)
    inputs, landed = _place_inputs(index.get("inputs") or [], tree, outdir)
    settings_doc = json.loads(_fill(json.dumps(index["settings"]), tree, writable))
    settings = LaunchSettings(**settings_doc)
    env = {k: v for k, v in os.environ.items() if k not in set(index["unset"])}
    env.update({k: _fill(v, tree, writable, inputs) for k, v in index["env"].items()})
    cwd = (tree / index["cwd"]).resolve()
    if not cwd.is_relative_to(tree.resolve()):
        raise NoVerdictError("the bundle's working directory leaves its tree.")

    confinement = index["confinement"]
    confined = False
    reason = "--no-sandbox"
    if confinement["sandbox"]:
        from manifest.rerun.sandbox import unavailable_reason

        why = unavailable_reason()
        confined, reason = why is None, why or ""
    if not confined and confinement["require_sandbox"]:
        raise NoVerdictError(f"--require-sandbox: the re-run cannot be confined on this host: "
                             f"{reason}.")
    # Data the user said every node sees at its own path (--shared-path): bound read-only
    # at that path when confined (the private /tmp and the read-only system hide it).
    shared = tuple((Path(p), Path(p)) for p in index.get("shared") or []
                   if os.path.isabs(p) and os.path.exists(p))
    workspace = Workspace(root=tree, scratch=outdir, tree=tree, cwd=cwd, mount_at=tree,
                          ro_binds=(*shared, *landed))
    used = None
    if index.get("environment"):  # --env run: the run's own, rebuilt and proven on this node
        from manifest.rerun.environment import NodeRebuild, in_environment, on_node

        used = on_node(NodeRebuild.from_json(index["environment"]), tree=tree,
                       cache_dir=env_cache)
        env, workspace = in_environment(used, env, workspace)
    node_env = {"environment": {**used.to_json(), "node": os.uname().nodename}} if used else {}
    if env_only:
        return {"format": RESULT_FORMAT, "bundle": expect, **node_env}
    executor = LocalExecutor(confined=confined, network=bool(confinement["network"]))
    # The plan's own fields are not read by the local executor beyond argv.
    plan = _StubPlan(tuple(_fill(a, tree, writable, inputs) if inputs else a
                           for a in index["argv"]))
    result = executor.run(plan, workspace, settings, env,  # type: ignore[arg-type]
                          writable=writable)
    artifacts, missing = digest_outputs(list(index["outputs"]), cwd, malformed_ok=True)
    fetched: dict[str, str] = {}
    if index["fetch_outputs"]:
        for artifact in artifacts:
            fetched[artifact.path] = base64.b64encode(
                (cwd / artifact.path).read_bytes()).decode("ascii")
    from manifest.rerun.cluster.node_env import probe_on_node

    probe = probe_on_node(used, env)  # the environment the re-run used: verify's drift
    where = ("bubblewrap on " + os.uname().nodename + ": system read-only, private /tmp, "
             + ("network allowed (--network)" if confinement["network"] else "no network")
             if confined else f"not confined on the host ({reason})")
    tree_text = str(tree)
    return {
        "format": RESULT_FORMAT,
        "bundle": expect,
        "exit_code": result.exit_code,
        "records": json.loads(json.dumps(result.records).replace(tree_text, "{tree}")),
        "env": {k: result.env[k] for k in RETURNED_ENV if k in result.env},
        "op_streams": {k: base64.b64encode(v).decode("ascii")
                       for k, v in result.op_streams.items()},
        "opened": {p.replace(tree_text, "{tree}"): k for p, k in result.opened.items()},
        "modules": sorted(result.modules),
        "started_ns": result.started_ns,
        "outside": result.outside,
        "workers": result.workers,
        "artifacts": [a.model_dump(mode="json") for a in artifacts],
        "missing": missing,
        "writable": [_files_under(path) for path in writable],
        "outputs": fetched,
        "confinement": where,
        "host_tree": tree_text,
        "probe": probe,
        **node_env,
    }


class _StubPlan:
    """What :class:`~manifest.rerun.executor.LocalExecutor` reads of a plan: its argv."""

    def __init__(self, argv: tuple[str, ...]) -> None:
        self.argv = argv


def encode_result(doc: dict[str, Any]) -> list[str]:
    """The result as marker-delimited lines of base64 (zlib), for a job log."""
    text = base64.b64encode(zlib.compress(json.dumps(doc).encode(), 6)).decode("ascii")
    return [BEGIN, *(text[i:i + LINE] for i in range(0, len(text), LINE)), END]


def decode_result(log: str) -> dict[str, Any] | None:
    """The result a job printed with ``--emit`` (the last one), or None."""
    start = log.rfind(BEGIN)
    end = log.find(END, start)
    if start < 0 or end < 0:
        return None
    body = "".join(log[start + len(BEGIN):end].split())
    try:
        doc: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(body)))
    except (ValueError, zlib.error):
        return None
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m manifest.rerun.remote", allow_abbrev=False)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("outdir", type=Path, nargs="?",
                        help="where to run and write result.json (default: a temporary "
                        "directory removed at exit; use with --emit)")
    parser.add_argument("--expect", required=True, help="the bundle's name (blake3:…)")
    parser.add_argument("--emit", action="store_true",
                        help="also print the result on stdout between marker lines")
    parser.add_argument("--env-cache", type=Path, default=None,
                        help="where rebuilt environments are kept (--env run; default the "
                        "folder the bundle names, else this user's cache)")
    parser.add_argument("--env-only", action="store_true",
                        help="rebuild and prove the run's environment, then stop (an init "
                        "container)")
    args = parser.parse_args(argv)
    if args.outdir is None:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="manifest-remote-") as tmp:
            args.outdir = Path(tmp)
            return _main(args)
    return _main(args)


def started_from(bundle: Path) -> str | None:
    """Why this process may have imported code from the bundle (None: it cannot have).

    ``python -m`` puts the working directory first on ``sys.path``; Ray Jobs runs the
    entrypoint with the bundle as its working directory (``working_dir``), so a
    ``manifest/`` package placed at the bundle's root would be the code that checks the
    bundle. Every executor starts the entrypoint isolated (``python -I``: no working
    directory, no ``PYTHONPATH``); started otherwise, with the bundle or a folder inside it
    on ``sys.path``, it refuses before reading a byte of the bundle."""
    root = os.path.realpath(bundle)
    for entry in sys.path:
        where = os.path.realpath(entry or ".")
        if where == root or where.startswith(root.rstrip("/") + "/"):
            return (f"sys.path holds {where}, in the bundle (started as python -m without "
                    "-I, from the bundle's folder?)")
    package = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))
    if package == root or package.startswith(root.rstrip("/") + "/"):
        return f"the manifest package was imported from {package}, in the bundle"
    return None


def _main(args: argparse.Namespace) -> int:
    from manifest.errors import EXIT_NO_VERDICT, ManifestError

    try:
        doc = run_bundle(args.bundle.resolve(), args.outdir.resolve(), args.expect,
                         env_cache=args.env_cache, env_only=args.env_only)
    except ManifestError as exc:
        sys.stderr.write(f"manifest: remote: refused: {exc.message}\n")
        refusal = {"format": RESULT_FORMAT, "bundle": args.expect, "refused": exc.message}
        try:
            args.outdir.mkdir(parents=True, exist_ok=True)
            (args.outdir / RESULT).write_text(json.dumps(refusal), encoding="utf-8")
        except OSError:
            pass
        if args.emit:
            sys.stdout.write("\n".join(encode_result(refusal)) + "\n")
        return EXIT_NO_VERDICT
    (args.outdir / RESULT).write_text(json.dumps(doc), encoding="utf-8")
    if args.emit:
        sys.stdout.write("\n".join(encode_result(doc)) + "\n")
        sys.stdout.flush()
    code: int = doc.get("exit_code", 0)  # --env-only: built and proven
    return code


if __name__ == "__main__":
    raise SystemExit(main())
