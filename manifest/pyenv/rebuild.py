"""Rebuild a run's Python environment with uv, and prove it: the library entry point.

    build_environment(manifest, trust=decision, find_links=[...], index_urls=[...])
        -> BuiltEnvironment(python, proof, cached, plan)

``python`` is the rebuilt venv's interpreter (None when nothing could be built: a
distribution vanished), ``proof`` each distribution's status against the record
(``manifest.pyenv.prove``), ``cached`` whether the venv came from the cache
(``manifest.pyenv.cache``), ``plan`` the sources used and withheld
(``manifest.pyenv.sources``). A verb that re-runs in the run's environment calls this,
shows ``proof.line()`` before any training starts, and runs ``python`` only when it may.

The steps, in order; nothing is installed before the first three pass:

1. every recorded name, version, tag, URL and hash is validated (a hostile one is one
   sentence, exit 2);
2. the sources are decided: the user's, and the recorded ones only when the manifest is
   trusted (the same decision verify uses);
3. each wheel (or a recorded sdist, by its file name and recorded sha256) is located in
   them; a distribution no source serves is ``vanished``, and then nothing is built. An
   sdist is built only for a trusted manifest (sealed here, signed by a trusted identity,
   or ``--trust``): building it runs its build backend, unconfined, which is running the
   manifest author's code; for any other manifest it is ``built-here``, not built
   (:data:`UNTRUSTED_SDIST`);
4. uv builds the venv: ``uv venv`` with the recorded Python, then ``uv pip install
   --no-deps --no-index`` of exactly the located files, each by URL with its sha256
   (``--require-hashes``): exact pins, no resolution (an sdist is built by uv, its build
   backend from the same find-links folders);
5. the proof hashes the installed files against the record.

The machine's configuration never leaks in: uv runs with ``--no-config`` (no ``uv.toml``,
no ``[tool.uv]``) and an environment with every ``PIP_*`` and ``UV_*`` variable removed,
and it reads no pip configuration (pip's ``/etc/xdg/pip/pip.conf``, constraints and
find-links are pip's alone). ``--link-mode copy``: a script that edits an installed file
edits the venv's copy, never uv's cache.

uv is an optional extra (``pip install 'torch-manifest[rebuild]'``), found lazily with
``uv.find_uv_bin()``. Measured here (``benchmarks/rebuild.py``, the bundled example's 10
distributions with torch 2.13.0+cpu, 2 cores at load average ~7): cold, 28.8 s against
27.7-36.6 s for ``uv venv`` + ``uv pip install`` alone on the same list (paired median
ratio 0.97x; locating and hashing the wheels ~0.6 s, the proof ~3.4 s); warm, 2.1-3.2 s
wall for 0.5-0.6 s of CPU (0.5 s wall on an idle machine). The cache's checks (a fresh
``uv venv`` to compare ``bin/python`` and ``pyvenv.cfg`` with, every RECORD read for
unexpected files) cost ~0.3 s of that: ``manifest env build`` of the bundled example
warm, 0.75-1.08 s against 0.64-0.96 s without them (six runs each, alternating, load
average ~4.4).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from manifest.errors import ManifestError, MissingExtraError, NoVerdictError, UsageError
from manifest.pyenv import cache
from manifest.pyenv.archives import Archive, locate
from manifest.pyenv.prove import Proof, not_built, prove_pins, site_packages
from manifest.pyenv.sources import (
    HostileRecordError,
    Pin,
    SourcePlan,
    pins_of,
    plan_sources,
    rebuild_set,
)

if TYPE_CHECKING:
    from manifest.models import Manifest
    from manifest.trust import TrustDecision

UV_TIMEOUT_S = 3600
"""A cold CUDA stack is ~5 GB to download; an hour before uv is given up on."""


class RebuildError(ManifestError):
    """uv failed to build an environment whose files were all located (exit 3)."""

    exit_code = NoVerdictError.exit_code


@dataclass(frozen=True)
class BuiltEnvironment:
    python: Path | None
    """The rebuilt venv's interpreter; None when nothing was built."""
    proof: Proof
    cached: bool
    plan: SourcePlan
    key: str
    """The environment's cache key (``manifest.pyenv.cache.environment_key``)."""


UNTRUSTED_SDIST = ("not built: building an sdist runs its code, and this manifest is not "
                   "trusted (--trust)")
"""The reason an sdist of an untrusted manifest is ``built-here`` instead of built."""


def trusted_pins(pins: list[Pin], trust: TrustDecision) -> list[Pin]:
    """``pins`` with each ``sdist`` turned ``built-here`` (:data:`UNTRUSTED_SDIST`) unless
    ``trust`` allows running the manifest's code: a build backend is code, the sdist's."""
    if trust.allowed:
        return pins
    from dataclasses import replace

    return [replace(p, kind="built-here", why=UNTRUSTED_SDIST) if p.kind == "sdist" else p
            for p in pins]


def find_uv() -> str:
    """The uv binary of the ``rebuild`` extra; one sentence with the install line if absent."""
    try:
        import uv  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise MissingExtraError("uv", "rebuild", what="rebuilding an environment") from None
    found: str = uv.find_uv_bin()
    return found


def scrubbed_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment uv runs in: this one without any ``PIP_*`` or ``UV_*`` variable
    (an index, a constraint, a find-links or a config file named there would leak in),
    nor ``VIRTUAL_ENV``/``CONDA_PREFIX`` (uv is told its target)."""
    env = dict(os.environ if environ is None else environ)
    return {k: v for k, v in env.items()
            if not k.upper().startswith(("PIP_", "UV_"))
            and k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "PYTHONHOME")}


def recorded_pins(manifest: Manifest, tree: Path | None) -> list[Pin]:
    """The distributions a rebuild installs, validated (``sources.pins_of``)."""
    env = manifest.env
    if not env.distributions:
        raise UsageError("this manifest does not record its distributions by content "
                         "(env.distributions): capture the run again with this version of "
                         "manifest to rebuild its environment.")
    only = rebuild_set(env.distributions, env.imported)
    return pins_of(env.distributions, tree=tree, only=only)


def find_python(version: str, uv_bin: str) -> str:
    """An interpreter of exactly the recorded Python version: this one, or one uv knows
    (never downloaded)."""
    here = ".".join(str(p) for p in sys.version_info[:3])
    if version == here:
        return sys.executable
    done = subprocess.run([uv_bin, "python", "find", "--no-config", "--no-python-downloads",
                           "--", version], capture_output=True, text=True, check=False,
                          env=scrubbed_environment(), timeout=120)
    if done.returncode != 0 or not done.stdout.strip():
        raise NoVerdictError(f"the run used Python {version}, which is not installed here "
                             f"(this is {here}): install it (uv python install {version}) "
                             "to rebuild the run's environment.")
    return done.stdout.strip().splitlines()[-1]


def _uv(uv_bin: str, args: list[str], what: str) -> None:
    done = subprocess.run([uv_bin, *args], capture_output=True, text=True, check=False,
                          env=scrubbed_environment(), timeout=UV_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        from manifest.redact import redact_urls

        tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise RebuildError(f"uv could not {what}: {redact_urls(tail)}")


def requirements(pins: list[Pin], located: dict[str, Archive]) -> str:
    """The requirement lines uv installs: each located file by URL, with its sha256."""
    lines = []
    for pin in pins:
        archive = located.get(pin.name)
        if archive is None:
            continue
        if any(ch.isspace() or ord(ch) < 0x20 for ch in archive.url):
            raise HostileRecordError(f"refusing the URL found for {pin.name}: it holds "
                                     "white space or control characters.")
        line = f"{pin.name} @ {archive.url}"
        if archive.sha256:
            line += f" --hash=sha256:{archive.sha256}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def build_environment(manifest: Manifest, *, trust: TrustDecision,
                      find_links: Iterable[str | Path] = (), index_urls: Iterable[str] = (),
                      tree: Path | None = None, cache_dir: Path | None = None,
                      note: Callable[[str], None] | None = None) -> BuiltEnvironment:
    """Rebuild ``manifest``'s environment and prove it (the module docstring's steps).

    ``trust`` is :func:`manifest.trust.check_trust`'s decision for this manifest;
    ``tree`` the project's tree (recorded ``file://`` URLs must lie inside it);
    ``cache_dir`` defaults to :func:`manifest.pyenv.cache.cache_root`; ``note`` receives
    progress sentences (the CLI prints them on stderr).
    """
    say = note or (lambda _text: None)
    pins = trusted_pins(recorded_pins(manifest, tree), trust)
    plan = plan_sources(manifest.env.sources, find_links=find_links, index_urls=index_urls,
                        trust=trust, tree=tree, pins=pins)
    root, why = cache.usable_root(cache_dir or cache.cache_root())
    if why is not None:
        say(f"{why}; building in a private folder ({root})")
    key = cache.environment_key(manifest.env.python, pins)
    folder = cache.place(root, key)
    if folder.is_dir():
        uv_bin = find_uv()
        fresh = fresh_venv(uv_bin, find_python(manifest.env.python, uv_bin))
        used = _cached(folder, key, pins, fresh, plan)
        if isinstance(used, BuiltEnvironment):
            return used
        say(f"not using the cached environment {folder}: {used}; rebuilding it")
        if cache.unsafe(folder) is None:
            cache.forget(folder, key)
        else:
            root = cache.private_root()
            cache.forget(cache.place(root, key), key)
    installable = [p for p in pins if p.kind in ("index", "archive", "sdist")]
    located: dict[str, Archive] = {}
    for pin in installable:
        found = locate(pin, plan)
        if found is not None:
            located[pin.name] = found
    vanished = frozenset(p.name for p in installable if p.name not in located)
    if vanished:
        return BuiltEnvironment(None, not_built(pins, vanished), False, plan, key)
    uv_bin = find_uv()
    python = find_python(manifest.env.python, uv_bin)
    built = cache.staging(root)
    try:
        sdists = [p.name for p in installable if p.kind == "sdist"]
        say(f"building the run's environment ({len(located)} distributions"
            + (f"; built here from the recorded sdist: {', '.join(sdists)}" if sdists else "")
            + ") with uv")
        _venv(uv_bin, python, built)
        base = cache.venv_facts(built)[2]  # what uv venv itself writes in site-packages
        reqs = built / "manifest-requirements.txt"
        reqs.write_text(requirements(pins, located), encoding="utf-8")
        hashed = all(a.sha256 for a in located.values())
        # an sdist's build backend comes from the same folders, nowhere else
        backends = [a for f in plan.find_links for a in ("--find-links", f)] if sdists else []
        _uv(uv_bin, ["pip", "install", "--no-config", "--quiet", "--no-deps", "--no-index",
                     *backends, "--link-mode", "copy",
                     "--python", str(built / "bin" / "python"),
                     *(["--require-hashes"] if hashed else []), "-r", str(reqs)],
            "install the run's distributions")
        site = site_packages(built)
        proof = prove_pins(site, pins, base=base)
        folder = cache.publish(root, key, built, {"proof": proof.to_json(),
                                                  "files": cache.files_stamp(site)})
    except BaseException:
        cache.discard(built)
        raise
    if cache.read_stamp(folder, key) is None:  # another build won the race: check its copy
        used = _cached(folder, key, pins, fresh_venv(uv_bin, python), plan)
        if not isinstance(used, BuiltEnvironment):
            raise RebuildError(f"the environment another build cached at {folder} is not "
                               f"usable: {used}")
        return used
    return BuiltEnvironment(folder / "bin" / "python", proof, False, plan, key)


def _venv(uv_bin: str, python: str, target: Path) -> None:
    _uv(uv_bin, ["venv", "--no-config", "--quiet", "--relocatable", "--python", python,
                 "--no-python-downloads", str(target), "--allow-existing"], "create a venv")


def fresh_venv(uv_bin: str, python: str) -> cache.FreshVenv:
    """What a fresh build's ``uv venv`` writes (``cache.venv_facts``), made in a temporary
    folder (~0.05 s): a cached venv's ``bin/python*``, ``pyvenv.cfg`` and site-packages are
    compared with it."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="manifest-fresh-venv-") as scratch:
        _venv(uv_bin, python, Path(scratch) / "venv")
        return cache.venv_facts(Path(scratch) / "venv")


def _cached(folder: Path, key: str, pins: list[Pin], fresh: cache.FreshVenv,
            plan: SourcePlan) -> BuiltEnvironment | str:
    """The cached venv at ``folder``, checked (``manifest.pyenv.cache``), or why it may not
    be used. With this user's stamp and no file changed since, the stored proof stands;
    else every file is hashed against the record, and a copy with no stamp of this user's
    is used only when that proves it. Unexpected files fail the proof, and then no
    interpreter is returned: nothing of that venv runs."""
    unsafe = cache.unsafe(folder)
    if unsafe is not None:
        return "it " + unsafe.removeprefix(f"{folder} ")
    problem = cache.venv_problem(folder, fresh)
    if problem is not None:
        return problem
    site = site_packages(folder)
    stamp = cache.read_stamp(folder, key)
    files = cache.files_stamp(site)
    kept = Proof.from_json(stamp.get("proof")) if stamp is not None else None
    if kept is None or stamp is None or stamp.get("files") != files:
        kept = prove_pins(site, pins, base=fresh[2])  # something was written: hash every file
        if stamp is None:
            if not kept.proven:
                return f"it is no copy this user built, and {kept.line()}"
            cache.write_stamp(folder, key, {"proof": kept.to_json(), "files": files})
    python = None if kept.unexpected else folder / "bin" / "python"
    return BuiltEnvironment(python, kept, True, plan, key)
