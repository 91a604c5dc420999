"""The bundle: what a cluster executor ships, content-addressed and checked on arrival.

A re-run on SLURM, Ray or Kubernetes cannot borrow this machine's git objects
or blob store, so the workspace travels. A bundle is a directory (Ray uploads
it as the job's ``working_dir``; SLURM and Kubernetes read it from a shared
or mounted filesystem):

* ``bundle.json``: the index, RFC 8785 canonical JSON: the recorded commit
  and patch digest (``code.diff_digest``), the blake3 of every file of the
  tree, the argv, working directory, declared outputs, the environment the
  verb set (a delta, see :func:`env_delta`) and the launcher settings;
* ``patch``: the recorded patch, the bytes whose blake3 is ``code.diff_digest``;
* ``tree/``: the scratch clone at the commit with the patch applied (its
  ``.git`` left out; datasets copied into it, links followed); for a verb
  that runs in the user's own tree (``lab``, ``--in-place``), the files git
  lists there and the declared data inside it (:func:`tree_files`).

The bundle's name is ``blake3:`` + the blake3 of the index's canonical bytes.
The submitter passes that name to the remote entrypoint on its command line,
a channel apart from the shipped files, so :func:`check_bundle` on arrival
proves, before anything runs, that the index is the one addressed, that the
patch is the recorded one (an edited patch changes its blake3), and that the
tree holds exactly the files indexed (an edited, added or removed file is
refused). The patch is checked against the recorded digest, and the tree
was built by applying it to the recorded commit here (the same scratch clone
a local re-run uses, whose patch the code probe reproduces before shipping).

No credential enters a bundle: the environment is the delta the verb made
to this process's own (recorded numerics variables, code paths), without
any variable whose name looks secret (``manifest.redact``) and without
``MANIFEST_SECRET_N`` (withheld argv values are filled on the remote side
from its own environment). Paths of this machine are written as
placeholders (``{tree}``, ``{writable:N}``) the remote side fills in.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from manifest.errors import NoVerdictError

BUNDLE_FORMAT = "manifest-bundle/v1"
INDEX = "bundle.json"
PATCH = "patch"
TREE = "tree"
TREE_TOKEN = "{tree}"  # noqa: S105 - a path placeholder, not a password
DATA_DIR = ".manifest-data"
"""Where data outside the repository travels inside the tree (``inputs`` of the index)."""


class BundleRefused(NoVerdictError):
    """What arrived is not what was addressed (exit 3 on the verb's side)."""


@dataclass(frozen=True)
class Bundle:
    """A built bundle: where it is, its name, and how many bytes it holds."""

    path: Path
    name: str
    """``blake3:<hex>`` of the index's canonical bytes."""
    bytes: int
    files: int


def _canonical(doc: Any) -> bytes:
    from manifest.canonical import canonical_bytes

    return canonical_bytes(doc)


def file_digest(path: Path) -> str:
    h = blake3.blake3()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "blake3:" + h.hexdigest()


def _walk(tree: Path) -> Iterator[tuple[str, Path]]:
    """(POSIX path relative to ``tree``, path) for every file, ``.git`` left out, links
    followed; in sorted order so two walks of one tree agree."""
    for dirpath, dirnames, filenames in os.walk(tree, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) == tree and d == ".git"))
        for name in sorted(filenames):
            full = Path(dirpath, name)
            if full.is_file():
                yield full.relative_to(tree).as_posix(), full


def _listed(tree: Path, only: Sequence[str]) -> Iterator[tuple[str, Path]]:
    """(POSIX path, path) for each of ``only`` that is a file of ``tree`` (links followed),
    sorted as :func:`_walk` sorts, so the arrival check's walk of the copy agrees."""
    for rel in sorted(set(only)):
        full = tree / rel
        if full.is_file() and full.resolve().is_relative_to(tree.resolve()):
            yield Path(rel).as_posix(), full


def env_delta(env: Mapping[str, str], here: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(variables the verb set or changed, variables it removed) relative to ``here``,
    without secrets: what the remote side applies to its own environment."""
    from manifest.redact import SECRET_ENV_PREFIX, is_secret_name

    def shippable(name: str) -> bool:
        return not name.startswith(SECRET_ENV_PREFIX) and not is_secret_name(name)

    changed = {k: v for k, v in env.items() if here.get(k) != v and shippable(k)}
    removed = sorted(k for k in here if k not in env and shippable(k))
    return changed, removed


def _placeholders(value: str, paths: Sequence[tuple[str, str]]) -> str:
    for local, token in paths:
        value = value.replace(local, token)
    return value


def build_bundle(dest: Path, *, tree: Path, cwd: Path, mount_at: Path, argv: Sequence[str],
                 outputs: Sequence[str], patch: bytes | None, commit: str | None,
                 diff_digest: str | None, settings: dict[str, Any], env: Mapping[str, str],
                 writable: Sequence[Path] = (), topology: dict[str, Any] | None = None,
                 fetch_outputs: bool = False, sandbox: bool = True, network: bool = False,
                 require_sandbox: bool = False, only: Sequence[str] | None = None,
                 inputs: Sequence[tuple[Path, str, str | None]] = (),
                 shared: Sequence[str] = (),
                 environment: Mapping[str, Any] | None = None) -> Bundle:
    """Write the bundle for one run into ``dest`` (which must not exist). ``only``: the
    files of ``tree`` to ship (the user's own tree: see :func:`tree_files`), else all.
    ``inputs``: data outside the repository shipped with it, each (source, the path the
    command names it by, where a relative reference from the tree lands or None), copied
    under ``tree/.manifest-data/<i>`` and indexed like every file (:data:`DATA_DIR`).
    ``shared``: data the job reads at its own path (``--shared-path``), bound read-only
    there when the job is confined. ``environment``: ``--env run``'s request
    (``manifest.rerun.environment.NodeRebuild.to_json``), which the node rebuilds and proves
    before it runs anything; part of the index, so of the bundle's name."""
    if patch is not None and "blake3:" + blake3.blake3(patch).hexdigest() != diff_digest:
        raise NoVerdictError("the scratch tree does not reproduce the recorded patch; "
                             "refusing to ship it.")
    dest.mkdir(parents=True)
    paths = [(str(mount_at), TREE_TOKEN), (str(tree), TREE_TOKEN)]
    paths = [(str(w), f"{{writable:{i}}}") for i, w in enumerate(writable)] + paths
    delta, removed = env_delta(env, os.environ)
    files: dict[str, str] = {}
    sizes: dict[str, int] = {}
    total = 0
    for rel, full in (_walk(tree) if only is None else _listed(tree, only)):
        target = dest / TREE / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(full, target)
        if os.access(full, os.X_OK):
            target.chmod(0o755)
        files[rel] = file_digest(target)
        sizes[rel] = target.stat().st_size
        total += sizes[rel]
    shipped: list[dict[str, Any]] = []
    for i, (source, named, landing) in enumerate(inputs):
        at = f"{DATA_DIR}/{i}"
        walked = [("", source)] if source.is_file() else list(_walk(source))
        for rel, full in walked:
            inside = f"{at}/{rel}" if rel else f"{at}/{source.name}"
            target = dest / TREE / inside
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(full, target)
            files[inside] = file_digest(target)
            sizes[inside] = target.stat().st_size
            total += sizes[inside]
        shipped.append({"path": named, "landing": landing,
                        "at": at if not source.is_file() else f"{at}/{source.name}"})
    if patch is not None:
        (dest / PATCH).write_bytes(patch)
        total += len(patch)
    ship_settings = json.loads(_placeholders(json.dumps(settings), paths))
    index = {
        "format": BUNDLE_FORMAT,
        "code": {"commit": commit, "diff_digest": diff_digest},
        "files": files,
        "sizes": sizes,
        **({"patch_bytes": len(patch)} if patch is not None else {}),
        "argv": list(argv),
        "cwd": cwd.relative_to(tree).as_posix() if cwd != tree else ".",
        "outputs": list(outputs),
        "env": {k: _placeholders(v, paths) for k, v in sorted(delta.items())},
        "unset": removed,
        "settings": ship_settings,
        "writable": len(writable),
        "topology": topology or {},
        "fetch_outputs": fetch_outputs,
        "confinement": {"sandbox": sandbox, "network": network,
                        "require_sandbox": require_sandbox},
        **({"inputs": shipped} if shipped else {}),
        **({"shared": sorted(shared)} if shared else {}),
        **({"environment": dict(environment)} if environment else {}),
    }
    data = _canonical(index)
    (dest / INDEX).write_bytes(data)
    total += len(data)
    return Bundle(dest, "blake3:" + blake3.blake3(data).hexdigest(), total, len(files))


MAX_DEPTH = 256
"""Folders deeper than this in an arriving tree are refused (no real tree comes close)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _shown(rel: str) -> str:
    from manifest.trust import escape_text

    return escape_text(rel)


class _Arrival:
    """One pass over an arriving bundle: every file opened once, relative to the descriptor
    of its folder and without following a link, hashed from that descriptor and (when
    ``dest`` is given) copied from it, so what was checked is what is copied."""

    def __init__(self, files: dict[str, str], sizes: dict[str, int],
                 dest: Path | None) -> None:
        self.files = files
        self.sizes = sizes
        self.dirs = {rel.rsplit("/", 1)[0] for rel in files if "/" in rel}
        for rel in list(self.dirs):
            while "/" in rel:
                rel = rel.rsplit("/", 1)[0]
                self.dirs.add(rel)
        self.dest = dest
        self.seen: set[str] = set()

    def _open_dir(self, parent: int, name: str, rel: str) -> int:
        try:
            before = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISDIR(before.st_mode):
                raise BundleRefused(f"{_shown(rel)} in the bundle is {_kind(before.st_mode)}, "
                                    "not a folder: refusing the bundle.")
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError as exc:
            raise BundleRefused(f"{_shown(rel)} of the bundle did not arrive.") from exc
        except OSError as exc:
            raise BundleRefused(f"cannot open {_shown(rel)} of the bundle without following "
                                f"links ({exc.strerror}): refusing it.") from exc
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            os.close(fd)
            raise BundleRefused(f"{_shown(rel)} of the bundle changed while it was checked: "
                                "refusing it.")
        return fd

    def digest(self, dir_fd: int, name: str, rel: str, kind: Any,
               copy_to: Path | None = None, size: int | None = None) -> str:
        """blake3 of the regular file ``name`` in ``dir_fd``, read once from one descriptor
        (and written to ``copy_to`` from the same reads); when the index gave its ``size``,
        a file of another size is refused before a byte is read, and one that grows while
        it is read is refused at the first byte beyond it."""
        from manifest.bounded import open_regular_at
        from manifest.errors import ManifestError

        try:
            opened = open_regular_at(dir_fd, name, kind, shown=f"{_shown(rel)} in the bundle")
        except BundleRefused:
            raise
        except ManifestError as exc:
            raise BundleRefused(exc.message) from exc
        assert opened is not None
        fd, st = opened
        out = -1
        if size is not None and st.st_size != size:
            os.close(fd)
            raise BundleRefused(f"{_shown(rel)} in the bundle is {st.st_size} bytes, not the "
                                f"shipped {size}: refusing to run edited code.")
        try:
            if copy_to is not None:
                out = os.open(copy_to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | getattr(os, "O_CLOEXEC", 0),
                              0o755 if st.st_mode & 0o111 else 0o644)
            h = blake3.blake3()
            read = 0
            while chunk := os.read(fd, 1 << 20):
                read += len(chunk)
                if size is not None and read > size:
                    raise BundleRefused(f"{_shown(rel)} in the bundle grew while it was "
                                        "checked: refusing it.")
                h.update(chunk)
                view = memoryview(chunk)
                while out >= 0 and view:
                    view = view[os.write(out, view):]
        finally:
            os.close(fd)
            if out >= 0:
                os.close(out)
        return "blake3:" + h.hexdigest()

    def walk(self, dir_fd: int, prefix: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise BundleRefused(f"{_shown(prefix)} in the bundle is more than {MAX_DEPTH} "
                                "folders deep: refusing it.")
        for name in sorted(os.listdir(dir_fd)):
            rel = f"{prefix}/{name}" if prefix else name
            shown = _shown(f"{TREE}/{rel}")
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since the listing: reported below as not arrived
            if stat.S_ISDIR(st.st_mode):
                if rel not in self.dirs:
                    raise BundleRefused(f"{shown}/ arrived but is not part of the "
                                        "recorded tree.")
                if self.dest is not None:
                    (self.dest / rel).mkdir()
                sub = self._open_dir(dir_fd, name, f"{TREE}/{rel}")
                try:
                    self.walk(sub, rel, depth + 1)
                finally:
                    os.close(sub)
                continue
            if not stat.S_ISREG(st.st_mode):
                raise BundleRefused(f"{shown} in the bundle is {_kind(st.st_mode)}, not "
                                    "a regular file: refusing the bundle.")
            want = self.files.get(rel)
            if want is None:
                raise BundleRefused(f"{shown} arrived but is not part of the recorded "
                                    "tree.")
            from manifest.bounded import InputKind

            got = self.digest(dir_fd, name, f"{TREE}/{rel}", InputKind.ARTIFACT,
                              None if self.dest is None else self.dest / rel,
                              self.sizes.get(rel))
            if got != want:
                raise BundleRefused(f"{shown} arrived as {got}, not the shipped {want}: "
                                    "refusing to run edited code.")
            self.seen.add(rel)


def check_bundle(path: Path, expect: str, copy_to: Path | None = None) -> dict[str, Any]:
    """The index of the bundle at ``path``, after proving it is the one named ``expect``
    and that its patch and every file are the ones indexed. Raises :class:`BundleRefused`.

    Every file is opened once, relative to its folder's descriptor and never through a
    link (``O_NOFOLLOW``; :func:`manifest.bounded.open_regular_at`), and hashed from that
    descriptor; with ``copy_to`` the tree is copied there from the same reads, so no file
    can be swapped between the check and the copy (it lands in ``copy_to`` only once the
    whole bundle passed). Links, FIFOs, devices, sockets and anything beside ``tree/``,
    the index and the patch are refused; the index is read under the bounded reader's cap.
    """
    from manifest.bounded import InputKind, read_regular_at
    from manifest.errors import ManifestError

    try:
        root = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise BundleRefused(f"no bundle at {path}: {exc.strerror}.") from exc
    staging = None if copy_to is None else copy_to.with_name(copy_to.name + ".arriving")
    try:
        try:
            data = read_regular_at(root, INDEX, InputKind.BUNDLE_INDEX,
                                   shown=f"the bundle's index ({INDEX})")
        except ManifestError as exc:
            raise BundleRefused(exc.message) from exc
        name = "blake3:" + blake3.blake3(data).hexdigest()
        if name != expect:
            raise BundleRefused(f"the bundle's index is {name}, not the {expect} that was "
                                "submitted: refusing to run it.")
        index: dict[str, Any] = json.loads(data)
        if not isinstance(index, dict) or index.get("format") != BUNDLE_FORMAT:
            raise BundleRefused("the bundle's index is not a manifest-bundle/v1 index.")
        files = index.get("files")
        code = index.get("code")
        sizes = index.get("sizes", {})
        patch_bytes = index.get("patch_bytes")
        if (not isinstance(files, dict) or not isinstance(code, dict)
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
                or not isinstance(sizes, dict)
                or not all(isinstance(v, int) for v in sizes.values())
                or not (patch_bytes is None or isinstance(patch_bytes, int))):
            raise BundleRefused("the bundle's index is malformed (files, sizes, code).")
        extra = sorted(set(os.listdir(root)) - {INDEX, PATCH, TREE})
        if extra:
            raise BundleRefused(f"the bundle holds {_shown(extra[0])} beside {TREE}/, "
                                f"{INDEX} and {PATCH}: refusing it.")
        arrival = _Arrival(files, sizes, staging)
        recorded = code.get("diff_digest")
        if recorded is not None:
            try:
                present = os.stat(PATCH, dir_fd=root, follow_symlinks=False)
            except FileNotFoundError:
                present = None
            if present is None:
                raise BundleRefused(f"the recorded patch {recorded} is missing from the "
                                    "bundle.")
            arrived = arrival.digest(root, PATCH, PATCH, InputKind.BLOB, size=patch_bytes)
            if arrived != recorded:
                raise BundleRefused(f"the patch in the bundle is {arrived}, not the recorded "
                                    f"{recorded} (code.diff_digest): refusing to run edited "
                                    "code.")
        elif PATCH in os.listdir(root):
            raise BundleRefused("the bundle carries a patch the recorded run did not have.")
        if staging is not None:
            if staging.exists():
                shutil.rmtree(staging)
            staging.mkdir(parents=True)
        if files or TREE in os.listdir(root):  # a bundle of no files has no tree/
            tree = arrival._open_dir(root, TREE, TREE)
            try:
                arrival.walk(tree, "", 0)
            finally:
                os.close(tree)
        missing = sorted(set(files) - arrival.seen)
        if missing:
            raise BundleRefused(f"{_shown(missing[0])} of the recorded tree did not arrive.")
        if staging is not None and copy_to is not None:
            staging.rename(copy_to)
            staging = None
        return index
    except OSError as exc:  # a folder that vanished or cannot be listed mid-check
        raise BundleRefused(f"cannot read the bundle: {exc.strerror or exc}.") from exc
    finally:
        os.close(root)
        if staging is not None and staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def tree_files(tree: Path, inputs: Sequence[str] = ()) -> list[str]:
    """What to ship of a user's own tree (a verb run in place: ``lab``, ``--in-place``): the
    files git tracks and the untracked ones it does not ignore (``git ls-files``: no
    ``.venv``, no store, no build output), plus every file under the declared inputs that
    lie inside the tree (datasets are often ignored). Outside a git repository: every file.
    An input outside the tree cannot travel with it: one sentence (exit 2)."""
    import subprocess

    from manifest.errors import UsageError

    real = tree.resolve()
    extra: list[str] = []
    for source in inputs:
        where = Path(source).resolve()
        if not where.is_relative_to(real):
            raise UsageError(f"--on ships the tree the command runs in; the data at {source} "
                             "lies outside it: move it into the tree or run here.")
        if where.is_file():
            extra.append(where.relative_to(real).as_posix())
        else:
            extra.extend((where / rel).relative_to(real).as_posix() for rel, _ in _walk(where))
    try:
        proc = subprocess.run(
            ["git", "-C", str(tree), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return [rel for rel, _ in _walk(tree)]
    listed = [name for name in proc.stdout.decode("utf-8", "surrogateescape").split("\0")
              if name]
    return sorted(set(listed) | set(extra))
