"""How a script resumes: the resume template, and conventions needing none (nanoGPT's).

The template is ``--resume-args`` or ``[tool.manifest] resume`` (``--resume
{checkpoint}``), read by :func:`resume_template`; the checkpoint's path goes
where ``{checkpoint}`` stands (:func:`resume_argv`).

``verify --segments`` replays a stretch of a run from a recorded checkpoint
through the script's own resume path (``manifest.verify.segments``). Without a
resume template, Lightning's and the Hugging Face Trainer's conventions are
taken in the launcher (``launch/boot/_manifest_checkpoints``); a nanoGPT-style
script is resumed by its argv instead, which this module works out.

nanoGPT's ``train.py`` keeps its settings as module-level globals
(``init_from = 'scratch'``, ``out_dir = 'out'``), then runs
``exec(open('configurator.py').read())``, which walks ``sys.argv[1:]``: a word
with ``=`` (``--key=value``) overrides the global ``key`` (the value through
``ast.literal_eval``, a plain string when that fails), any other word is a
config file executed in the script's globals. With ``init_from == 'resume'``
the script loads ``os.path.join(out_dir, 'ckpt.pt')``: one fixed path,
overwritten at every save.

The rule (:func:`resume_convention_argv`). The script is never imported or
executed: the python file the argv runs (the word after ``python`` and its own
options, or after torchrun's options) is read as a regular file of at most
:data:`MAX_SOURCE` bytes (``manifest.bounded``) and parsed with :mod:`ast`; so is each file below.
It is nanoGPT-style when all of these hold:

1. its module scope binds ``init_from`` and ``out_dir`` only by plain
   assignments of a string literal (``init_from = 'scratch'``), at least one
   each, no ``global`` statement names them anywhere;
2. a module-level ``exec(open('<file>').read())`` follows those assignments,
   and ``<file>`` (relative to the command's cwd) is a configurator: a ``for``
   loop over ``sys.argv`` that assigns to ``globals()[…]``. The same loop
   written in the script itself, after the assignments, counts too;
3. it compares ``init_from`` with ``'resume'`` (``==`` or ``in``) somewhere;
4. it holds the string literal ``'ckpt.pt'`` (the file it resumes from).

The checkpoint it would load is ``<out_dir>/ckpt.pt``, ``out_dir`` taken as
the configurator would: the script's last default, then each argv word in
order: ``--out_dir=value``, or a config file whose module scope binds
``out_dir`` only by plain string-literal assignments (the last one counts).
A config file that binds it any other way (a computed value, inside an ``if``,
``+=``), or that cannot be read or parsed, leaves the path unknown.

Each distinct file is read and parsed once per answer (:class:`_Sources`: cached by
its resolved path and its digest), with a total budget of :data:`MAX_PARSED` bytes
parsed and :data:`MAX_FILES` files read; past it the answer is "cannot tell" (None).
Parsing costs 1-6 s per MiB of Python on this 2-core machine (the most for
``x = 1`` lines), and the script's statements and argv words are the author's:
re-parsing the file at every mention took 44 s for ten 1 MiB
``exec(open(...).read())`` mentions, and 200 mentions, or one config file named
3,000 times in argv, ran past 90 s.

Only when the recorded checkpoint is that path is the script given
``--init_from=resume`` (every recorded ``--init_from=…`` word dropped, the new
one last, so no config file after it can undo it); otherwise the answer is
None and the replay runs as recorded, to be named as not resumed. The launcher
proves the resume itself: with ``MANIFEST_RESUME_FROM`` set, a ``torch.load``
of that file records ``resumed_from``.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from manifest.bounded import InputKind, cap_of, read_user_file
from manifest.errors import ManifestError, UsageError
from manifest.launch.boot import _manifest_wire as wire

MAX_SOURCE = cap_of(InputKind.SCRIPT)
"""The most bytes of a script or config file read (the bounded reader's cap for a script)."""
MAX_PARSED = 256 << 10
"""Bytes parsed in all for one answer: nanoGPT's train.py, configurator and a config file
together are about 20 KB; 256 KiB of ``x = 1`` lines (the slowest Python to parse per
byte measured) took 1.2-1.3 s on this 2-core machine under a load of 12."""
MAX_FILES = 32
"""Distinct files read for one answer (nanoGPT reads three)."""
CHECKPOINT_NAME = "ckpt.pt"
RESUME_WORD = "--init_from=resume"
_NAMES = ("init_from", "out_dir")
_PYTHON = re.compile(r"python[0-9.]*")
_PYTHON_VALUED = {"-W", "-X", "--check-hash-based-pycs"}
"""The interpreter's options that take the next word as their value."""


def resume_convention_argv(script_tree_cwd: Path, argv: list[str],
                           checkpoint: str) -> list[str] | None:
    """The argv that resumes a nanoGPT-style script from ``checkpoint`` (a path relative
    to the command's cwd, ``script_tree_cwd``): the recorded ``argv`` with
    ``--init_from=resume``; None when the script is not one, or would not load that
    checkpoint (the module docstring has the rule)."""
    try:
        return _resume_argv(_Sources(), script_tree_cwd, argv, checkpoint)
    except _CannotTell:
        return None


def _resume_argv(sources: _Sources, script_tree_cwd: Path, argv: list[str],
                 checkpoint: str) -> list[str] | None:
    at = _script_index(argv)
    if at is None:
        return None
    script = sources.get(script_tree_cwd / argv[at])
    if script is None:
        return None
    out_dir = _script_defaults(sources, script.tree, script_tree_cwd)
    if out_dir is None:
        return None
    words = argv[at + 1:]
    for word in words:
        if "=" in word:
            key, _, value = word.partition("=")
            if key == "--out_dir":
                out_dir = _argv_value(value)
            elif not key.startswith("--"):
                return None  # the configurator would refuse it: the run could not have run
        elif word.startswith("--"):
            return None
        else:
            out_dir = _config_out_dir(sources, script_tree_cwd / word, out_dir)
        if out_dir is None:
            return None
    fixed = os.path.normpath(os.path.join(out_dir, CHECKPOINT_NAME))
    if fixed != os.path.normpath(checkpoint):
        return None
    kept = [w for w in words if not w.startswith("--init_from=")]
    return [*argv[:at + 1], *kept, RESUME_WORD]


# ------------------------------------------------------------------ reading


def _script_index(argv: list[str]) -> int | None:
    """Where the python file the command runs sits in ``argv``."""
    from manifest.nodes.torchrun import find_torchrun

    line = find_torchrun(argv)
    if line is not None:
        return line.end if line.end < len(argv) and argv[line.end].endswith(".py") else None
    for i, word in enumerate(argv):
        if _PYTHON.fullmatch(os.path.basename(word)):
            j = i + 1
            while j < len(argv) and argv[j].startswith("-") and argv[j] != "-":
                if argv[j] in ("-m", "-c") or argv[j].startswith(("-m", "-c")):
                    return None  # a module or a string: no file of its own to read
                j += 2 if argv[j] in _PYTHON_VALUED else 1
            return j if j < len(argv) and argv[j].endswith(".py") else None
    return 0 if argv and argv[0].endswith(".py") else None


class _CannotTell(Exception):
    """The budget of one answer is spent: the answer is None ("cannot tell")."""


@dataclass
class _Parsed:
    """A parsed file and what the rules ask of it, each worked out once."""

    tree: ast.Module

    @cached_property
    def argv_loop(self) -> bool:
        return _argv_loop(self.tree.body)

    @cached_property
    def out_dir(self) -> list[tuple[int, str]] | None:
        return _plain_bindings(self.tree, "out_dir")


@dataclass
class _Sources:
    """The files one answer reads, each read and parsed once, within a budget.

    Cached by the resolved path with its identity (device, inode, size, mtime), so a file
    named again is not read again; and by the digest of its bytes, so the same text under
    two names is parsed once. Reading a new file past :data:`MAX_FILES`, or parsing past
    :data:`MAX_PARSED` bytes, raises :class:`_CannotTell`.
    """

    files_left: int = MAX_FILES
    bytes_left: int = MAX_PARSED
    _places: dict[tuple[str, int, int, int, int], str] = field(default_factory=dict)
    _parsed: dict[str, _Parsed | None] = field(default_factory=dict)

    def get(self, path: Path) -> _Parsed | None:
        """``path`` parsed, or None: missing, not a regular file, over :data:`MAX_SOURCE`,
        unreadable (the bounded reader: a FIFO or a device is never read), not Python."""
        try:
            real = os.path.realpath(path)
            st = os.stat(real)
        except (OSError, ValueError):
            return None
        place = (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        digest = self._places.get(place)
        if digest is None:
            if self.files_left <= 0:
                raise _CannotTell
            self.files_left -= 1
            try:
                source = read_user_file(path, InputKind.SCRIPT)
            except ManifestError:
                return None
            digest = hashlib.sha256(source).hexdigest()
            self._places[place] = digest
            if digest not in self._parsed:
                self._parsed[digest] = self._parse(source, path)
        return self._parsed[digest]

    def _parse(self, source: bytes, path: Path) -> _Parsed | None:
        if len(source) > self.bytes_left:
            raise _CannotTell
        self.bytes_left -= len(source)
        try:
            return _Parsed(ast.parse(source, filename=str(path)))
        except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
            return None


def _module_scope(nodes: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node in module scope: into ``if``/``for``/``with``/``try`` blocks, not into
    functions, classes or lambdas (scopes of their own). Comprehensions are walked: a
    ``:=`` in one binds in module scope (their loop names then count too, erring on the
    side of "unknown")."""
    stack: list[ast.AST] = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # Decorators, defaults and bases are evaluated in module scope.
            outer: list[ast.AST] = [*node.decorator_list]
            if isinstance(node, ast.ClassDef):
                outer += [*node.bases, *node.keywords]
            else:
                outer += [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
            stack.extend(reversed(outer))
            continue
        if isinstance(node, ast.Lambda):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _binds(node: ast.AST, name: str) -> bool:
    """Whether ``node`` (one node, not its children) binds ``name`` in its scope."""
    if isinstance(node, ast.Name):
        return node.id == name and isinstance(node.ctx, (ast.Store, ast.Del))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, ast.ExceptHandler):
        return node.name == name
    if isinstance(node, (ast.MatchAs, ast.MatchStar)):
        return node.name == name
    if isinstance(node, ast.MatchMapping):
        return node.rest == name
    return False


def _literal_assignment(stmt: ast.stmt, name: str) -> str | None:
    """The string of ``name = '<str>'`` (or ``name: str = '<str>'``), else None."""
    if isinstance(stmt, ast.Assign):
        if len(stmt.targets) != 1:
            return None
        target, value = stmt.targets[0], stmt.value
    elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        target, value = stmt.target, stmt.value
    else:
        return None
    if (isinstance(target, ast.Name) and target.id == name
            and isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return value.value
    return None


def _plain_bindings(tree: ast.Module, name: str) -> list[tuple[int, str]] | None:
    """(top-level statement index, value) of every binding of ``name`` in module scope,
    or None when one of them is not a plain top-level string-literal assignment (or a
    ``global`` statement anywhere names it)."""
    literal: dict[int, tuple[int, str]] = {}
    for i, stmt in enumerate(tree.body):
        value = _literal_assignment(stmt, name)
        if isinstance(stmt, ast.Assign) and value is not None:
            literal[id(stmt.targets[0])] = (i, value)
        elif isinstance(stmt, ast.AnnAssign) and value is not None:
            literal[id(stmt.target)] = (i, value)
    found: list[tuple[int, str]] = []
    for node in _module_scope(tree.body):
        if _binds(node, name):
            if id(node) not in literal:
                return None
            found.append(literal[id(node)])
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return None
    return sorted(found)


def _is_text(node: ast.AST, text: str) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value == text


def _is_call_to(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == name)


def _exec_file(stmt: ast.stmt) -> str | None:
    """``'<file>'`` of a statement ``exec(open('<file>').read())``, else None."""
    if not (isinstance(stmt, ast.Expr) and _is_call_to(stmt.value, "exec")):
        return None
    call = stmt.value
    assert isinstance(call, ast.Call)
    if len(call.args) != 1 or call.keywords:
        return None
    read = call.args[0]
    if not (isinstance(read, ast.Call) and isinstance(read.func, ast.Attribute)
            and read.func.attr == "read" and not read.args and not read.keywords):
        return None
    opened = read.func.value
    if not (_is_call_to(opened, "open") and isinstance(opened, ast.Call) and opened.args):
        return None
    first = opened.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def _is_sys_argv(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "argv"
               and isinstance(n.value, ast.Name) and n.value.id == "sys"
               for n in ast.walk(node))


def _writes_globals(node: ast.AST) -> bool:
    """Whether ``node`` holds ``globals()[…] = …``."""
    for n in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(n, ast.Assign):
            targets = n.targets
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            targets = [n.target]
        if any(isinstance(t, ast.Subscript) and _is_call_to(t.value, "globals")
               for t in targets):
            return True
    return False


def _argv_loop(stmts: list[ast.stmt]) -> bool:
    """A configurator: a module-level ``for`` over ``sys.argv`` assigning ``globals()[…]``."""
    return any(isinstance(s, ast.For) and _is_sys_argv(s.iter) and _writes_globals(s)
               for s in stmts)


def _configurator_at(sources: _Sources, tree: ast.Module, cwd: Path) -> int | None:
    """The index of the first top-level statement that applies argv overrides."""
    for i, stmt in enumerate(tree.body):
        if _argv_loop([stmt]):
            return i
        name = _exec_file(stmt)
        if name is not None:
            executed = sources.get(cwd / name)
            if executed is not None and executed.argv_loop:
                return i
    return None


def _compares_resume(tree: ast.Module) -> bool:
    """Whether ``init_from`` is compared with ``'resume'`` (``==`` or ``in``)."""
    def is_init_from(n: ast.AST) -> bool:
        return isinstance(n, ast.Name) and n.id == "init_from"

    def holds_resume(n: ast.AST) -> bool:
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return any(_is_text(e, "resume") for e in n.elts)
        return _is_text(n, "resume")

    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
            if isinstance(op, ast.Eq) and (
                    (is_init_from(left) and holds_resume(right))
                    or (is_init_from(right) and holds_resume(left))):
                return True
            if isinstance(op, ast.In) and is_init_from(left) and holds_resume(right):
                return True
    return False


def _names_checkpoint(tree: ast.Module) -> bool:
    return any(_is_text(n, CHECKPOINT_NAME) for n in ast.walk(tree))


def _script_defaults(sources: _Sources, tree: ast.Module, cwd: Path) -> str | None:
    """The script's ``out_dir`` default when it is nanoGPT-style (rules 1–4), else None."""
    bindings = {name: _plain_bindings(tree, name) for name in _NAMES}
    at = _configurator_at(sources, tree, cwd)
    if at is None or not _compares_resume(tree) or not _names_checkpoint(tree):
        return None
    out_dir: str | None = None
    for name, found in bindings.items():
        if not found or any(i > at for i, _ in found):
            return None  # unset, bound another way, or set again after the overrides
        if name == "out_dir":
            out_dir = found[-1][1]
    return out_dir


def _argv_value(value: str) -> str | None:
    """A ``--out_dir=`` value as the configurator takes it: a literal when it parses as
    one (it must then be a string), else the text itself."""
    try:
        parsed = ast.literal_eval(value)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return value
    return parsed if isinstance(parsed, str) else None


def _config_out_dir(sources: _Sources, path: Path, current: str) -> str | None:
    """``out_dir`` after the configurator runs the config file ``path``: its last plain
    literal assignment, ``current`` when it binds none, None when unknown."""
    parsed = sources.get(path)
    if parsed is None:
        return None
    found = parsed.out_dir
    if found is None:
        return None
    return found[-1][1] if found else current


# ------------------------------------------------------------ templates


PLACEHOLDER = "{checkpoint}"
NO_TEMPLATE = (
    "the script did not resume: it takes no resume argument the manifest knows of",
    "Set [tool.manifest] resume = \"--resume {checkpoint}\" in pyproject.toml, or pass "
    "--resume-args '--resume {checkpoint}'.")
RESUME_VAR = wire.RESUME_VAR


def resume_template(root: Path, given: str | None) -> list[str] | None:
    """The resume arguments: ``--resume-args``, else ``[tool.manifest] resume``; None
    when neither is set: then the checkpoint goes to a known convention (Lightning's
    ``Trainer.fit(ckpt_path=…)``) through ``MANIFEST_RESUME_FROM``, and a replay that
    did not take it is named as not resumed."""
    if given is None:
        from manifest.config import load_config

        table, _ = load_config(root)
        given = table.get("resume")
    if given is None:
        return None
    args = shlex.split(given) if isinstance(given, str) else [str(a) for a in given]
    if not any(PLACEHOLDER in a for a in args):
        raise UsageError(f"the resume template {shlex.join(args)!r} has no {PLACEHOLDER}.",
                         hint="Write where the checkpoint goes, e.g. --resume {checkpoint}.")
    return args


def resume_argv(argv: list[str], template: list[str] | None, checkpoint: str) -> list[str]:
    return [*argv, *(a.replace(PLACEHOLDER, checkpoint) for a in template or [])]
