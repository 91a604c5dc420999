"""Every example in README.md and docs/ runs, or is checked against the code, in the tests.

Each fenced block is preceded by a marker saying what the tests do with it,
``<!-- check: KIND [status=0,1] [stream=stderr] -->``, and a block without one
fails :func:`test_every_block_is_marked`. Kinds:

* ``run``: cheap commands, run here in a folder holding the golden manifests
  under the names the pages use; ``$ cmd`` lines are followed by the stdout they
  must print (``...`` on a line of its own stands for any lines, inside a line
  for any text);
* ``session NAME``: the blocks of one session run in order, for real, on the
  bundled example committed in a scratch git repository (``slow``); digests,
  numbers, runs of spaces and table rules compare as "one of those", since
  timings and run_ids differ from run to run and the text is what drifts;
* ``parse``: commands that need a project, a key or the network; each
  ``manifest`` command is parsed by the real parser, each other program must be
  one a reader has (pip, git …), and a script or file it names must exist;
* ``python``: executed in a fresh interpreter (``slow`` when it imports torch);
* ``diagram``: a Mermaid diagram (``mermaid`` fence) of a known type whose brackets and
  quotes close on every line (the docs check in ``tests/test_docs_site.py`` draws them);
* ``config``: TOML, YAML and JSON parse; a ``[tool.manifest]`` table passes the
  validator capture uses; a pre-commit hook id and a reusable workflow or
  action named with ``uses:`` exist in this repository; each member of a JSON
  excerpt of a manifest validates against the schema's field of that name.

A small runner of our own rather than a Markdown-testing plugin: pytest-examples
and phmdoctest run Python and print output only, and sybil would need a custom
parser for shell sessions with stdin redirections, exit statuses and
whitespace-insensitive table output anyway; the whole of this runner is the
marker regex, the matcher and the four kinds above.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.runs import REPO

KINDS = {"run", "session", "parse", "python", "config", "layout", "diagram"}
"""``layout``: README's package listing, which tests/test_layout.py checks against the package."""
EXTERNAL = {"pip", "python", "python3", "git", "openssl", "model_signing", "cd", "bash", ".",
            "ruff", "mypy", "pytest", "jq", "mkdir", "printf", "head", "uv"}
"""Programs other than ``manifest`` that a ``parse`` block may name."""

MARKER = re.compile(r"<!-- check: (\w+)((?:\s+[\w-]+(?:=\S+)?)*)\s*-->")
GOLDEN = REPO / "tests" / "golden"
FIXTURES = {
    "run.json": GOLDEN / "manifest_v1.json",
    "a.json": GOLDEN / "diff" / "seed_change" / "a.json",
    "b.json": GOLDEN / "diff" / "seed_change" / "b.json",
    "same-a.json": GOLDEN / "diff" / "same_run_id_outputs" / "a.json",
    "same-b.json": GOLDEN / "diff" / "same_run_id_outputs" / "b.json",
}
"""The files a ``run`` block finds in its folder, by the names the pages use."""

SESSION_SETUP = {
    # A manifest sealed on "another machine" (another seal list), with a dataset.
    "untrusted": "printf 'data/\\n' > .gitignore && git add .gitignore && "
                 "git commit -qm ignore && mkdir -p data/cifar && printf x > data/cifar/a.bin && "
                 "XDG_DATA_HOME=$PWD/../elsewhere manifest capture --seed 42 --data data/cifar "
                 "-- python train.py --steps 5 > their-run.json",
    # How the example resumes, for verify --segments and lab --resume-at (guides/long-runs).
    "long-runs": "printf '[tool.manifest]\\nresume = \"--resume {checkpoint}\"\\n' > "
                 "pyproject.toml && git add pyproject.toml && git commit -qm resume",
}


@dataclass
class Block:
    page: str
    line: int
    kind: str
    args: list[str]
    attrs: dict[str, str]
    lang: str
    body: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Step:
    command: str
    expected: list[str] | None = None
    status: set[int] = field(default_factory=lambda: {0})


def pages() -> list[Path]:
    found = [REPO / "README.md"]
    found += sorted((REPO / "docs").rglob("*.md"))
    return found


def blocks(path: Path) -> Iterator[Block | tuple[str, int]]:
    """Every fenced block of a page: a :class:`Block`, or (page, line) when unmarked."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(REPO))
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang = lines[i][3:].strip()
            end = i + 1
            while not lines[end].startswith("```"):
                end += 1
            marker = MARKER.fullmatch(lines[i - 1].strip()) if i else None
            if marker is None:
                yield page, i + 1
            else:
                words = marker.group(2).split()
                attrs = dict(w.split("=", 1) for w in words if "=" in w)
                yield Block(page, i + 1, marker.group(1), [w for w in words if "=" not in w],
                            attrs, lang, "\n".join(lines[i + 1:end]))
            i = end
        i += 1


def all_blocks(kind: str | None = None) -> list[Block]:
    return [b for p in pages() for b in blocks(p)
            if isinstance(b, Block) and (kind is None or b.kind == kind)]


def steps(block: Block) -> list[Step]:
    """The commands of a block, with the output each must print when shown."""
    status = {int(s) for s in block.attrs.get("status", "0").split(",")}
    lines = block.body.replace("\\\n", "").splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return [Step(line, None, status) for line in lines if line.strip()]
    found: list[Step] = []
    for line in lines:
        if line.startswith("$ "):
            found.append(Step(line[2:], []))
        elif found:
            assert found[-1].expected is not None
            found[-1].expected.append(line)
    found[-1].status = status
    return found


def _regex(expected: list[str]) -> re.Pattern[str]:
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(re.escape(line.rstrip()).replace(r"\.\.\.", r"[^\n]*?") + r"\n")
    return re.compile("".join(parts))


def normalise(text: str) -> str:
    """What a session compares: digests, hex ids and numbers (with their sign: a
    timing difference may fall either way) as one token each; runs of spaces and
    table rules collapsed."""
    text = re.sub(r"blake3:[0-9a-f]+…?", "blake3:H", text)
    text = re.sub(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", "H", text)
    text = re.sub(r"(?:(?<=\s)[-+])?\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", text)
    text = re.sub(r"[━─]+", "━", text)
    return re.sub(r"[ \t]+", " ", text)


def matches(expected: list[str], actual: str, *, loose: bool) -> bool:
    if loose:
        expected = [normalise(line) for line in expected]
        actual = normalise(actual)
    while expected and not expected[-1].strip():
        expected = expected[:-1]
    text = "".join(line.rstrip() + "\n" for line in actual.splitlines())
    return _regex(expected).fullmatch(text) is not None


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MANIFEST_", "COLUMNS"))}
    env.update(COLUMNS="100", NO_COLOR="1", PYTHONHASHSEED="0", XDG_DATA_HOME=str(home / "xdg"),
               XDG_CONFIG_HOME=str(home / "config"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def run_steps(block: Block, cwd: Path, env: dict[str, str], *, loose: bool) -> list[str]:
    """Run the block's commands in order; what each printed (the stream the block shows)."""
    printed = []
    for step in steps(block):
        words = shlex.split(step.command, comments=True)
        missing = [w for w in ("jq",) if w in words and shutil.which(w) is None]
        if missing:
            pytest.skip(f"{block.name} pipes into {missing[0]}, not installed here")
        done = subprocess.run(["bash", "-c", step.command], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=900, check=False)
        where = f"{block.name}: {step.command}"
        assert done.returncode in step.status, f"{where}: exit {done.returncode}\n{done.stderr}"
        shown = done.stderr if block.attrs.get("stream") == "stderr" else done.stdout
        if step.expected is not None:
            assert matches(step.expected, shown, loose=loose), f"{where} printed:\n{shown}"
        printed.append(shown)
    return printed


# ------------------------------------------------------------------------- tests


def test_every_block_is_marked() -> None:
    unmarked = [f"{p}:{line}" for page in pages() for b in blocks(page)
                if isinstance(b, tuple) for p, line in [b]]
    assert unmarked == []
    kinds = {b.kind for b in all_blocks()}
    assert kinds <= KINDS, kinds - KINDS
    # Positive control: a fence with no marker is found.
    assert not MARKER.fullmatch("<!-- a comment -->")


def test_matcher_has_teeth() -> None:
    assert matches(["a", "...", "z ... end"], "a\nb\nc\nz middle end\n", loose=False)
    assert not matches(["a", "z"], "a\nb\nz\n", loose=False)
    assert matches(["run_id blake3:abc…", "took 1.5 s"],
                   "run_id  blake3:0123def…\ntook 22.75 s\n", loose=True)
    assert not matches(["seed 0 → 1"], "seed 0 -> 1\n", loose=True)
    assert matches(["determinism_cost_pct  -1.9%"], "determinism_cost_pct  +32.9%\n", loose=True)
    assert not matches(["cost 1.9%"], "cost 1.9 s\n", loose=True)


@pytest.fixture
def golden_folder(tmp_path: Path) -> Path:
    for name, source in FIXTURES.items():
        shutil.copyfile(source, tmp_path / name)
    return tmp_path


@pytest.mark.parametrize("block", all_blocks("run"), ids=lambda b: b.name)
def test_run_block(block: Block, golden_folder: Path) -> None:
    run_steps(block, golden_folder, _env(golden_folder), loose=False)


def _command_words(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line, without assignments and redirections."""
    words: list[str] = []
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    redirect = re.compile(r"[<>&]+")
    i = 0
    while i <= len(tokens):
        token = tokens[i] if i < len(tokens) else "|"
        following = tokens[i + 1] if i + 1 < len(tokens) else ""
        if token in ("|", "||", "&&", ";"):
            if words:
                yield words
            words = []
        elif redirect.fullmatch(token):
            i += 1  # the redirection's target
        elif token.isdigit() and redirect.fullmatch(following):
            pass  # the file descriptor of ``2>``
        elif not words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", token):
            pass  # an assignment before the command
        else:
            words.append(token)
        i += 1


def check_command(words: list[str]) -> None:
    from manifest.cli.app import build_parser

    program = words[0]
    if program == "manifest":
        build_parser(words[1:]).parse_args(words[1:])  # a UsageError fails the test
        return
    assert program in EXTERNAL, f"{program}: not a program the examples may name"
    if program in ("python", "python3", "bash") and len(words) > 1:
        if words[1] == "-c":
            compile(words[2], "<example>", "exec")
        elif not words[1].startswith("-"):
            assert (REPO / words[1]).exists(), words[1]


@pytest.mark.parametrize("block", all_blocks("parse"), ids=lambda b: b.name)
def test_parse_block(block: Block) -> None:
    for step in steps(block):
        for words in _command_words(step.command):
            check_command(words)


DIAGRAM_TYPES = ("flowchart", "graph", "sequenceDiagram", "stateDiagram-v2")


def diagram_problems(body: str) -> list[str]:
    """What is wrong with a Mermaid diagram's text, line by line (empty: nothing)."""
    lines = body.splitlines()
    if not lines or lines[0].split()[0] not in DIAGRAM_TYPES:
        return [f"not a known diagram type: {lines[:1]}"]
    problems = []
    for n, line in enumerate(lines[1:], 2):
        if line.count('"') % 2 or any(line.count(a) != line.count(b)
                                      for a, b in ("[]", "{}", "()")):
            problems.append(f"line {n}: an unclosed quote or bracket: {line.strip()}")
    return problems


@pytest.mark.parametrize("block", all_blocks("diagram"), ids=lambda b: b.name)
def test_diagram_block(block: Block) -> None:
    assert block.lang == "mermaid", block.name
    assert diagram_problems(block.body) == []
    # Positive control: the same diagram with a bracket left open is caught.
    assert diagram_problems(block.body + '\n  a["open --> b') != []


def test_parse_check_has_teeth() -> None:
    from manifest.errors import UsageError

    with pytest.raises(UsageError):
        check_command(["manifest", "capture", "--no-such-option", "--", "python", "t.py"])
    with pytest.raises(AssertionError):
        check_command(["curl", "https://example.com"])
    assert list(_command_words("A=1 manifest sign run.json --key k.pem > x 2>&1 | head -1")) \
        == [["manifest", "sign", "run.json", "--key", "k.pem"], ["head", "-1"]]


def _pre_commit_ids() -> set[str]:
    text = (REPO / ".pre-commit-hooks.yaml").read_text(encoding="utf-8")
    return set(re.findall(r"^- id: (\S+)", text, re.M))


@pytest.mark.parametrize("block", all_blocks("config"), ids=lambda b: b.name)
def test_config_block(block: Block, tmp_path: Path) -> None:
    if block.lang == "toml":
        data = tomllib.loads(block.body)
        if "tool" in data:
            from manifest.config import load_config

            (tmp_path / "pyproject.toml").write_text(block.body, encoding="utf-8")
            table, _ = load_config(tmp_path)
            assert table == data["tool"]["manifest"]
            from manifest.rerun.cluster.options import cluster_options

            executors = table.get("executors", {})
            for on in executors:  # each executor's table is its own options (or refused)
                cluster_options(on, {}, executors)
        return
    if block.lang == "json":
        _check_json_excerpt(json.loads(block.body))
        return
    assert block.lang == "yaml", block.name
    yaml = importlib.import_module("yaml")  # PyYAML comes with mkdocs (the docs extra)

    data = yaml.safe_load(block.body)
    assert data, block.name
    for hook in re.findall(r"- id: (\S+)", block.body):
        assert hook in _pre_commit_ids(), hook
    for target in re.findall(r"uses: OWNER/manifest/(\S+)@", block.body):
        assert (REPO / target).exists(), target


def _schema_fields(schema: dict[str, object]) -> dict[str, list[dict[str, object]]]:
    """Every property of the manifest schema, by name, with the definitions it may have."""
    found: dict[str, list[dict[str, object]]] = {}
    defs = schema["$defs"]
    assert isinstance(defs, dict)
    for definition in [schema, *defs.values()]:
        for name, prop in (definition.get("properties") or {}).items():
            found.setdefault(name, []).append(prop)
    return found


def _check_json_excerpt(doc: object) -> None:
    """Each member of a JSON excerpt is a manifest field, and its value validates as one."""
    jsonschema = importlib.import_module("jsonschema")
    schema = json.loads((REPO / "schemas" / "manifest.v1.schema.json").read_text("utf-8"))
    fields = _schema_fields(schema)
    assert isinstance(doc, dict) and doc, "a JSON excerpt is an object of manifest fields"
    for name, value in doc.items():
        assert name in fields, f"{name}: not a field of the manifest schema"
        errors = []
        for prop in fields[name]:
            try:
                jsonschema.validate(value, {**prop, "$defs": schema["$defs"]})
                break
            except jsonschema.ValidationError as exc:
                errors.append(exc.message)
        else:
            raise AssertionError(f"{name}: {errors}")


def test_json_check_has_teeth() -> None:
    _check_json_excerpt({"outside_recipe": [{"command": "python -S c.py", "reason": "-S",
                                             "site": "c.py:1"}]})
    bad: list[dict[str, object]] = [{"outside_recipes": []},
                                    {"outside_recipe": [{"command": "python"}]}]
    for doc in bad:
        with pytest.raises(AssertionError):
            _check_json_excerpt(doc)


def _slow(block: Block) -> bool:
    return "torch" in block.body


@pytest.mark.parametrize(
    "block", [pytest.param(b, marks=[pytest.mark.slow] if _slow(b) else [], id=b.name)
              for b in all_blocks("python")])
def test_python_block(block: Block, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-W", "error", "-c", block.body], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr


def _sessions() -> dict[str, list[Block]]:
    found: dict[str, list[Block]] = {}
    for block in all_blocks("session"):
        found.setdefault(block.args[0], []).append(block)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_sessions()))
def test_session(name: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copyfile(REPO / "examples" / "train.py", repo / "train.py")
    env = _env(tmp_path)
    git = "git -c user.name=docs -c user.email=docs@example.invalid"
    setup = f"git init -q && git add train.py && {git} commit -qm example"
    if name in SESSION_SETUP:
        setup += f" && {SESSION_SETUP[name].replace('git commit', f'{git} commit')}"
    subprocess.run(["bash", "-c", setup], cwd=repo, env=env, check=True, capture_output=True)
    printed = {block.name: run_steps(block, repo, env, loose=True)
               for block in _sessions()[name]}
    # What the session printed is what the docs build puts on the pages (docs/gen_sessions.py).
    spec = importlib.util.spec_from_file_location("gen_sessions",
                                                  REPO / "docs" / "gen_sessions.py")
    assert spec is not None and spec.loader is not None
    gen_sessions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_sessions)
    gen_sessions.store(name, printed)


def test_sessions_are_known() -> None:
    assert set(SESSION_SETUP) <= set(_sessions())
    assert {"getting-started", "verify", "explain", "lab"} <= set(_sessions())
