"""In-process observation: what the run actually did, with where it did it.

The launcher (``_manifest_launch``) sets seeds and switches before user code
runs; a script is free to change them afterwards, and most real ones do
(``L.seed_everything(7)``, ``torch.backends.cuda.matmul.allow_tf32 = True``,
``with torch.autocast(...)``). Sampling the state at exit misses all of it,
so this module watches the calls themselves and adds to the process record:

* ``reseeds``: every call that reseeds a global generator (``random.seed``,
  ``numpy.random.seed``, ``torch.manual_seed``, ``torch.cuda.manual_seed(_all)``,
  Lightning's ``seed_everything``, transformers' ``set_seed``) or builds a
  seeded ``numpy.random.default_rng``: value, call site, the generators it
  covered and which of those had already been drawn from since the launcher
  seeded them, or since the script's previous seeding (fingerprint
  comparison, exact). A generator reseeded before any
  draw makes the launcher's seed irrelevant to it: ``diff`` says so.
* ``switches``: every recipe switch the script changes (deterministic
  algorithms, cuDNN flags, TF32 old and new, matmul precision) and the first
  entry into each kind of autocast region, with value and call site.
* ``loaders``: the base seed of each multi-worker DataLoader iterator.
* ``unaccounted``: generators whose draws the fingerprints at start and exit
  cannot account for: a state set from a saved one (``random.setstate``,
  numpy's ``set_state``, ``torch.set_rng_state``, which ``fork_rng`` and
  activation checkpointing call), or draws made before torch was imported
  (the launcher reseeds then, so the state at start does not show them).
  ``diff`` calls a generator never drawn from only when it is not listed.
* CUDA generator fingerprints at CUDA's first initialisation (queued with
  torch's own lazy-init mechanism, so we never initialise CUDA ourselves).
* ``opened``: files opened, from Python's audit hook ``open`` event (it sees
  ``open``, ``os.open``, ``np.memmap``, ``torch.load``; not C libraries that
  open files themselves). Files under the interpreter's own prefixes and
  system directories are skipped in the hook; capture decides the rest.
* ``modules``: top-level names of the modules imported, mapped by capture to
  distributions (identity counts only those).
* ``outside``: Python processes this one started outside the recipe, from the
  audit events that start a program, judged by ``_manifest_escape``, with
  the call site.

Longer than 500 lines because every watcher here reads and writes one private state
(``_obs``: the record, the launching flag, the fingerprints since the last
seeding, the outer seeding call) at each intercepted call; the parts that
need none of it live beside it (``_manifest_rng`` fingerprints,
``_manifest_escape`` judges a started program).

Costs: the audit hook is one Python call per audited event (imports make
most of them; about 1 µs each); a reseed hashes the generators it touches
(a few KiB). Lists are capped so a script reseeding every step stays small.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mypy checks the calls between these modules through the package
    from manifest.launch.boot import _manifest_rng as rng
    from manifest.launch.boot import _manifest_wire as wire
else:
    try:  # under the launcher this directory is on sys.path; as a package module otherwise
        import _manifest_rng as rng
        import _manifest_wire as wire
    except ImportError:  # pragma: no cover - exercised through manifest.launch.recipe
        from manifest.launch.boot import _manifest_rng as rng
        from manifest.launch.boot import _manifest_wire as wire

MAX_RESEEDS = 32
MAX_SWITCHES = 64
MAX_LOADERS = 16
MAX_OPENED = 20000
MAX_OUTSIDE = 32
_START_EVENTS = frozenset({"subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn",
                           "os.system"})  # the audit events that start a program

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SYSTEM_DIRS = ("/usr/", "/lib/", "/lib64/", "/etc/", "/proc/", "/sys/", "/dev/", "/run/",
                "/bin/", "/sbin/", "/var/lib/", "/var/cache/", "/snap/")

_obs: dict[str, Any] = {
    "launch": None,
    "own": (),
    "opened": {},
    "record": None,
    "root": None,
    "skip": (),
    "code_skip": (),
    "launch_fp": {},
    "depth": 0,
    "outer": None,
    "autocast_seen": set(),
    "launching": False,
}


# ------------------------------------------------------------------ helpers


def _prefixes() -> tuple[str, ...]:
    """Directories whose files are the interpreter's and libraries': never inputs."""
    import site
    import sysconfig

    found: set[str] = set()
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        if p:
            found.add(os.path.abspath(p) + os.sep)
    with contextlib.suppress(Exception):
        for p in sysconfig.get_paths().values():
            found.add(os.path.abspath(p) + os.sep)
    with contextlib.suppress(Exception):
        for p in [*site.getsitepackages(), site.getusersitepackages()]:
            found.add(os.path.abspath(p) + os.sep)
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p):
            found.add(os.path.abspath(p) + os.sep)
    return tuple(sorted(found))


def call_site() -> str:
    """``file:line`` of the first frame outside the libraries and this tool.

    Repo-relative inside the repository; elsewhere only the file name, so a
    home directory never enters a manifest.
    """
    skip = _obs["code_skip"]
    frame = sys._getframe(1)
    fallback = None
    while frame is not None:
        name = frame.f_code.co_filename
        if fallback is None and not name.startswith(_obs["own"]):
            fallback = frame
        if not name.startswith(skip) and not name.startswith("<frozen"):
            return _where(name, frame.f_lineno)
        frame = frame.f_back  # type: ignore[assignment]
    if fallback is not None:
        return _where(fallback.f_code.co_filename, fallback.f_lineno)
    return "?"


def _where(name: str, line: int) -> str:
    root = _obs["root"]
    if root and name.startswith(root + os.sep):
        return f"{os.path.relpath(name, root)}:{line}"
    return f"{os.path.basename(name)}:{line}"


def _append(key: str, item: dict[str, Any], cap: int) -> None:
    record = _obs["record"]
    if record is None:
        return
    items = record.setdefault(key, [])
    if len(items) < cap:
        items.append(item)


# ------------------------------------------------------------- audit hook


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open":
        if event in _START_EVENTS:
            _on_start(event, args)
        return
    try:
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        elif not isinstance(path, str):
            path = os.fspath(path)
        if not path.startswith("/"):
            path = os.path.join(os.getcwd(), path)
        if path.startswith(_obs["skip"]):
            return
        if isinstance(mode, str):
            kind = "rw" if "+" in mode else ("w" if any(c in mode for c in "wax") else "r")
        elif isinstance(flags, int) and flags & _WRITE_FLAGS:
            kind = "rw" if flags & os.O_RDWR else "w"
        else:
            kind = "r"
        opened = _obs["opened"]
        path = os.path.normpath(path)
        previous = opened.get(path)
        if previous is None:
            if len(opened) < MAX_OPENED:
                opened[path] = kind
        elif previous == "r" and kind != "r":
            opened[path] = "rw"
    except Exception:  # never break the user's open()
        return


def _on_start(event: str, args: tuple[Any, ...]) -> None:
    """A program is being started: name it if it is a Python process outside the recipe."""
    if _obs["record"] is None:
        return
    try:
        try:
            import _manifest_escape as escape  # type: ignore[import-not-found]
        except ImportError:  # pragma: no cover - the package's copy, outside the launcher
            from manifest.launch.boot import _manifest_escape as escape
        found = escape.from_audit_event(event, args)
    except Exception:  # never break the user's start of a program
        return
    if found is not None:
        found["site"] = call_site()
        _append("outside", found, MAX_OUTSIDE)
        if event == "os.exec":  # this image is about to be replaced: write its record now
            with contextlib.suppress(Exception):
                _obs["launch"]._write_record()


# ---------------------------------------------------------------- seeding


def _fingerprints(generators: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for g in generators:
        with contextlib.suppress(Exception):
            if g == "python":
                out[g] = rng.python_rng_fingerprint()
            elif g == "numpy":
                out[g] = rng.numpy_rng_fingerprint()
            elif g == "torch_cpu":
                out[g] = rng.torch_rng_fingerprints()[0]
            elif g == "cuda":
                torch = sys.modules.get("torch")
                if torch is not None and torch.cuda.is_initialized():
                    out[g] = ",".join(rng.torch_rng_fingerprints()[1])
    return out


def note_launch_state(generators: list[str]) -> None:
    """Called by the launcher right after it seeds: the state a draw would move."""
    _obs["launch_fp"].update(_fingerprints(generators))


def _drawn(generators: list[str]) -> list[str]:
    now = _fingerprints(generators)
    launch = _obs["launch_fp"]
    return [g for g in generators if g in now and g in launch and now[g] != launch[g]]


_ALL = ["python", "numpy", "torch_cpu", "cuda"]


def _seed_text(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    value = args[0] if args else kwargs.get("seed")
    if value is None:
        return None
    with contextlib.suppress(Exception):
        return str(int(value))
    return None


def _wrap_seed(fn: Callable[..., Any], call: str, generators: list[str]) -> Callable[..., Any]:
    if getattr(fn, "__manifest_wrapped__", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _obs["launching"] or _obs["record"] is None:
            return fn(*args, **kwargs)
        outer = _obs["outer"]
        if outer is not None:  # inside seed_everything: counts for the outer call
            for g in generators:
                if g not in outer["generators"]:
                    outer["generators"].append(g)
            return fn(*args, **kwargs)
        # An umbrella call (no generators of its own) takes the state of all
        # of them now, before its inner calls move any.
        entry: dict[str, Any] = {"call": call, "seed": _seed_text(args, kwargs),
                                 "site": call_site(), "generators": list(generators),
                                 "drawn": _drawn(generators or _ALL)}
        _obs["outer"] = entry
        try:
            return fn(*args, **kwargs)
        finally:
            _obs["outer"] = None
            entry["drawn"] = [g for g in entry["drawn"] if g in entry["generators"]]
            _append("reseeds", entry, MAX_RESEEDS)
            # "drawn" means since the last seeding, the launcher's or the script's.
            note_launch_state(entry["generators"])

    wrapper.__manifest_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def note_unaccounted(generators: list[str]) -> None:
    """Draws from these generators may have happened where no fingerprint shows them."""
    record = _obs["record"]
    if record is None:
        return
    items = record.setdefault("unaccounted", [])
    for g in generators:
        if g not in items:
            items.append(g)


def _watch_restore(owner: Any, name: str, generators: list[str]) -> None:
    """A state set from a saved one can hide draws made in between (``fork_rng``)."""
    fn = getattr(owner, name, None)
    if not callable(fn) or getattr(fn, "__manifest_wrapped__", False):
        return

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _obs["launching"]:
            note_unaccounted(generators)
        return fn(*args, **kwargs)

    wrapper.__manifest_wrapped__ = True  # type: ignore[attr-defined]
    with contextlib.suppress(Exception):
        setattr(owner, name, wrapper)


def drawn_since_seeding(generators: list[str]) -> list[str]:
    """Generators drawn from since the launcher's (or the script's) last seeding."""
    return _drawn(generators)


def _patch(owner: Any, name: str, call: str, generators: list[str]) -> None:
    fn = getattr(owner, name, None)
    if callable(fn):
        with contextlib.suppress(Exception):
            setattr(owner, name, _wrap_seed(fn, call, generators))


def on_numpy(np: ModuleType) -> None:
    _patch(np.random, "seed", "numpy.random.seed", ["numpy"])
    _patch(np.random, "default_rng", "numpy.random.default_rng", [])
    _watch_restore(np.random, "set_state", ["numpy"])


def on_seed_module(module: ModuleType) -> None:
    """Lightning's ``seed_everything`` / transformers' ``set_seed``."""
    for name in ("seed_everything", "set_seed"):
        _patch(module, name, name, [])


SEED_MODULES = ("lightning_fabric.utilities.seed", "lightning.fabric.utilities.seed",
                "transformers.trainer_utils")


# --------------------------------------------------------------- switches


def _record_switch(switch: str, value: Any) -> None:
    if _obs["launching"] or _obs["record"] is None:
        return
    _append("switches", {"switch": switch, "value": str(value), "site": call_site()},
            MAX_SWITCHES)


def _watch_setattr(obj: Any, prefix: str, names: frozenset[str]) -> None:
    """Record assignments to ``names`` on ``obj`` (a module-like singleton)."""
    cls = type(obj)
    watched: dict[int, tuple[str, frozenset[str]]] | None = cls.__dict__.get(
        "__manifest_watched__")
    if watched is None:
        original: Any = cls.__setattr__
        watched = {}

        def __setattr__(self: Any, name: str, value: Any) -> None:
            assert watched is not None
            where = watched.get(id(self))
            if where is not None and name in where[1]:
                _record_switch(f"{where[0]}.{name}", value)
            original(self, name, value)

        with contextlib.suppress(TypeError):
            setattr(cls, "__setattr__", __setattr__)  # noqa: B010 - a class, not an instance
            setattr(cls, "__manifest_watched__", watched)  # noqa: B010
    watched[id(obj)] = (prefix, names)


_FP32 = frozenset({"fp32_precision"})


def _wrap_call(owner: Any, name: str, switch: str,
               value: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> None:
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "__manifest_wrapped__", False):
        return

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _record_switch(switch, value(args, kwargs))
        return fn(*args, **kwargs)

    wrapper.__manifest_wrapped__ = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def _first(args: tuple[Any, ...], kwargs: dict[str, Any], key: str) -> Any:
    return args[0] if args else kwargs.get(key)


def on_torch(torch: Any) -> None:
    """Watch torch's seeding calls, recipe switches, autocast, DataLoaders and CUDA init."""
    for owner in (torch, getattr(torch, "random", None)):
        if owner is not None:
            _patch(owner, "manual_seed", "torch.manual_seed", ["torch_cpu", "cuda"])
    for owner in (getattr(torch, "cuda", None), sys.modules.get("torch.cuda.random")):
        if owner is not None:
            _patch(owner, "manual_seed", "torch.cuda.manual_seed", ["cuda"])
            _patch(owner, "manual_seed_all", "torch.cuda.manual_seed_all", ["cuda"])
            _watch_restore(owner, "set_rng_state", ["cuda"])
            _watch_restore(owner, "set_rng_state_all", ["cuda"])
    for owner in (torch, getattr(torch, "random", None)):
        if owner is not None:
            _watch_restore(owner, "set_rng_state", ["torch_cpu"])

    def det_value(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        mode = _first(args, kwargs, "mode")
        return f"{mode} (warn_only)" if kwargs.get("warn_only") else mode

    _wrap_call(torch, "use_deterministic_algorithms", "torch.use_deterministic_algorithms",
               det_value)
    _wrap_call(torch, "set_float32_matmul_precision", "torch.set_float32_matmul_precision",
               lambda a, k: _first(a, k, "precision"))
    backends = torch.backends
    with contextlib.suppress(Exception):
        _watch_setattr(backends, "torch.backends", _FP32)
    with contextlib.suppress(Exception):
        _watch_setattr(backends.cudnn, "torch.backends.cudnn",
                       frozenset({"deterministic", "benchmark", "allow_tf32", "enabled",
                                  "fp32_precision"}))
    with contextlib.suppress(Exception):
        _watch_setattr(backends.cuda.matmul, "torch.backends.cuda.matmul",
                       frozenset({"allow_tf32", "fp32_precision",
                                  "allow_fp16_reduced_precision_reduction",
                                  "allow_bf16_reduced_precision_reduction"}))
    for path in ("cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn",
                 "mkldnn"):
        with contextlib.suppress(Exception):
            obj: Any = backends
            for part in path.split("."):
                obj = getattr(obj, part)
            _watch_setattr(obj, f"torch.backends.{path}", _FP32)
    with contextlib.suppress(Exception):
        _watch_autocast(torch.amp.autocast_mode.autocast)
    with contextlib.suppress(Exception):
        _watch_loaders(sys.modules["torch.utils.data.dataloader"])
    with contextlib.suppress(Exception):
        torch.cuda._lazy_call(_on_cuda_init)


def _watch_autocast(cls: Any) -> None:
    original = cls.__enter__
    if getattr(original, "__manifest_wrapped__", False):
        return

    def __enter__(self: Any) -> Any:
        result = original(self)
        with contextlib.suppress(Exception):
            key = (str(self.device), str(self.fast_dtype), bool(self._enabled))
            if key not in _obs["autocast_seen"]:
                _obs["autocast_seen"].add(key)
                state = "" if key[2] else " (disabled)"
                _record_switch("torch.autocast", f"{key[0]} {key[1]}{state}")
        return result

    __enter__.__manifest_wrapped__ = True  # type: ignore[attr-defined]
    cls.__enter__ = __enter__


def _watch_loaders(module: ModuleType) -> None:
    cls = module._BaseDataLoaderIter
    original = cls.__init__
    if getattr(original, "__manifest_wrapped__", False):
        return

    def __init__(self: Any, loader: Any) -> None:
        original(self, loader)
        with contextlib.suppress(Exception):
            workers = int(getattr(self, "_num_workers", 0))
            if workers > 0:
                _append("loaders", {"base_seed": str(int(self._base_seed)), "workers": workers,
                                    "site": call_site()}, MAX_LOADERS)

    __init__.__manifest_wrapped__ = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


def _on_cuda_init() -> None:
    """Runs inside torch's CUDA lazy init: queue the read of the states at first use.

    torch runs the queued calls of ``_lazy_call`` first and the queued seeds
    (``manual_seed``/``manual_seed_all``, kept apart by its seed tracker) after
    them, in one loop over ``torch.cuda._queued_calls``. A read taken here
    would see each device's generator before any seed reached it, and torch
    seeds a fresh CUDA generator from a nondeterministic source: on an H100
    two captures of one command got two run_ids that way. So the read is
    appended to that list, to run after the seeds, when the state is a
    function of the seed alone. (``_lazy_call`` itself cannot be used here:
    torch holds its non-reentrant init lock while the loop runs.) Where the
    list is not there, no CUDA state is recorded, rather than a random one.
    """
    torch = sys.modules.get("torch")
    if _obs["record"] is None or torch is None:
        return
    queued = getattr(getattr(torch, "cuda", None), "_queued_calls", None)
    if isinstance(queued, list):
        queued.append((_read_cuda_states, []))


def _read_cuda_states() -> None:
    """The CUDA generators' states once the queued seeds have run: the state at first use.

    It runs inside torch's init loop, where an exception would fail the user's
    first CUDA call: a state that cannot be read is not recorded, never raised.
    """
    record = _obs["record"]
    torch = sys.modules.get("torch")
    if record is None or torch is None:
        return
    digests = []
    try:
        for gen in torch.cuda.default_generators:
            digest = rng.blake3_hex([gen.get_state().numpy().tobytes()])
            if digest:
                digests.append(digest)
    except Exception:
        return
    if isinstance(record.get("at_start"), dict):
        record["at_start"]["cuda"] = digests
    _obs["launch_fp"]["cuda"] = ",".join(digests)


def fp32_precision(torch: Any) -> dict[str, str] | None:
    """PyTorch's newer TF32 switches, where this torch has them."""
    out: dict[str, str] = {}
    b = torch.backends
    for path in ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn",
                 "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn"):
        with contextlib.suppress(Exception):
            obj: Any = b
            for part in filter(None, path.split(".")):
                obj = getattr(obj, part)
            value = obj.fp32_precision
            out[("torch.backends." + path).rstrip(".")] = str(value)
    return out or None


# ------------------------------------------------------------------ start


def install(record: dict[str, Any], root: str | None, launch: ModuleType) -> None:
    """Start observing this process (called by the launcher before user code)."""
    _obs["launch"] = launch
    # Modules the interpreter loaded before user code (site, .pth hooks such as
    # setuptools' distutils shim): not imported by the run.
    _obs["startup"] = frozenset(name.partition(".")[0] for name in list(sys.modules))
    _obs["record"] = record
    _obs["root"] = root
    _obs["opened"] = {}
    here = os.path.dirname(os.path.abspath(__file__))
    tool = os.path.dirname(os.path.dirname(here))  # the manifest package
    _obs["own"] = (here + os.sep, tool + os.sep)
    libs = _prefixes()
    records = os.environ.get(wire.RECORDS_VAR)
    own_files = (os.path.abspath(records) + os.sep,) if records else ()
    _obs["skip"] = (*libs, *_SYSTEM_DIRS, here + os.sep, *own_files)
    _obs["code_skip"] = (*libs, here + os.sep, tool + os.sep)
    record["opened"] = _obs["opened"]
    random = sys.modules["random"]
    _patch(random, "seed", "random.seed", ["python"])
    _watch_restore(random, "setstate", ["python"])
    sys.addaudithook(_audit)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _after_fork_in_child() -> None:
    """A forked multiprocessing child (a DataLoader worker) ends with ``os._exit``, which
    skips atexit: its record (the files it read) is written by a multiprocessing finalizer.
    Every fork is counted at once (a worker killed later writes no record, and it may draw
    from the generators it inherited)."""
    with contextlib.suppress(Exception):
        _obs["launch"].note_worker()
    if "multiprocessing" not in sys.modules:
        return
    with contextlib.suppress(Exception):
        import multiprocessing.util as util

        util.Finalize(None, _obs["launch"]._write_record, exitpriority=0)


def _top_names() -> set[str]:
    return {name.partition(".")[0] for name in list(sys.modules)}


def note_user_start() -> None:
    """Called by the launcher when its start-up is done, right before user code: the
    libraries it loaded itself (blake3, for the generators' fingerprints) are the tool's."""
    _obs["tool"] = frozenset(_top_names() - _obs.get("startup", frozenset())
                             - frozenset(sys.stdlib_module_names))


def modules_imported() -> list[str]:
    """Top-level names of every imported module (the launcher's own left out).

    A library the launcher loaded before user code counts only where the run's
    own modules hold it (:func:`_held_elsewhere`): ``import blake3`` in the script
    finds it already loaded, so that import leaves no other trace.
    """
    own = {"_manifest_launch", "_manifest_observe", "_manifest_rng", "_manifest_state",
           "_manifest_switches", "_manifest_trail", "_manifest_opstream", "_manifest_escape",
           "sitecustomize",
           "__main__"}
    names = _top_names() - own - _obs.get("startup", frozenset())
    tool = frozenset(_obs.get("tool", frozenset())) & names
    if tool:
        names -= tool - _held_elsewhere(tool)
    return sorted(names)


def _held_elsewhere(names: frozenset[str]) -> set[str]:
    """Which of these top-level modules a module outside them and outside this tool holds:
    the module itself, or a class or function it defines, bound to a global
    (``import blake3``, ``from blake3 import blake3``) or the type of one (a hasher kept
    at module level). A name bound only inside a function is not seen. Reads every
    module's globals by identity, without attribute look-ups that a module's own
    ``__getattr__`` could answer: ~6 ms at exit with torch and numpy loaded."""
    from types import BuiltinFunctionType, FunctionType

    targets: dict[int, str] = {}
    for name, module in list(sys.modules.items()):
        top = name.partition(".")[0]
        if top not in names:
            continue
        targets[id(module)] = top
        with contextlib.suppress(Exception):
            for value in list(object.__getattribute__(module, "__dict__").values()):
                kind = type(value)
                if issubclass(kind, type):
                    owner = type.__getattribute__(value, "__module__")
                elif kind is FunctionType or kind is BuiltinFunctionType:
                    owner = object.__getattribute__(value, "__module__")
                else:
                    continue
                if isinstance(owner, str) and owner.partition(".")[0] == top:
                    targets[id(value)] = top
    skip = frozenset(sys.stdlib_module_names) | names
    held: set[str] = set()
    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in skip or name.startswith("_manifest_"):
            continue
        space = object.__getattribute__(module, "__dict__") if isinstance(
            module, ModuleType) else None
        if not isinstance(space, dict):
            continue
        where = space.get("__file__")
        if isinstance(where, str) and where.startswith(_obs["own"]):
            continue
        for value in list(space.values()):
            found = targets.get(id(value)) or targets.get(id(type(value)))
            if found is not None:
                held.add(found)
    return held


@contextlib.contextmanager
def launching() -> Any:
    """The launcher's own seeding and switches are not the script's: not recorded."""
    _obs["launching"] = True
    try:
        yield
    finally:
        _obs["launching"] = False
