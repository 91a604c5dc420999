"""The resume detector reads each distinct file once, within a budget (issue 38).

``manifest.verify.conventions`` parses the script a recorded command runs, the files
its ``exec(open(...).read())`` statements name and the config files its argv names.
All of these are the author's: the detector used to parse a file again at every
mention (ten 1 MiB mentions: 44 s; a config named 3,000 times: past 90 s). Each case
counts the parses with a spy around :func:`ast.parse` (it still parses): the
positive control is the honest nanoGPT tree, whose answer must not change; the
hostile twin must give the same answer with one parse per distinct file, or, past
the budget, "cannot tell" (None).
"""

from __future__ import annotations

import ast
import time
from pathlib import Path
from typing import Any

import pytest

from manifest.verify.conventions import (
    MAX_FILES,
    MAX_PARSED,
    MAX_SOURCE,
    RESUME_WORD,
    resume_convention_argv,
)
from tests.test_resume_nanogpt import CONFIG, CONFIGURATOR, TRAIN

EXEC = "exec(open('configurator.py').read())\n"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The file names ``ast.parse`` was given while the detector ran (it still parses)."""
    seen: list[str] = []
    real = ast.parse

    def counting(source: Any, filename: Any = "<unknown>", *args: Any, **kwargs: Any) -> Any:
        seen.append(Path(str(filename)).name)
        return real(source, filename, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting)
    return seen


def _tree(tmp_path: Path, train: str = TRAIN, **files: str) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name, text in {"train.py": train, "configurator.py": CONFIGURATOR, **files}.items():
        (tree / name).write_text(text)
    return tree


def test_the_honest_tree_is_answered_as_before(tmp_path: Path, parses: list[str]) -> None:
    tree = _tree(tmp_path, **{"config.py": CONFIG})
    argv = ["python", "train.py", "config.py"]
    assert resume_convention_argv(tree, argv, "out/tiny/ckpt.pt") == [*argv, RESUME_WORD]
    assert sorted(parses) == ["config.py", "configurator.py", "train.py"]


def test_a_config_named_3000_times_is_parsed_once(tmp_path: Path, parses: list[str]) -> None:
    tree = _tree(tmp_path, **{"config.py": CONFIG})
    argv = ["python", "train.py", *["config.py"] * 3000]
    started = time.monotonic()
    answer = resume_convention_argv(tree, argv, "out/tiny/ckpt.pt")
    elapsed = time.monotonic() - started
    print(f"3,000 mentions of one config: {elapsed:.3f} s, {len(parses)} parses")
    assert answer == [*argv, RESUME_WORD]
    assert sorted(parses) == ["config.py", "configurator.py", "train.py"]
    # The same text under another name is parsed once too (cached by its digest).
    (tree / "again.py").write_text(CONFIG)
    parses.clear()
    answer = resume_convention_argv(tree, ["python", "train.py", "config.py", "again.py"],
                                    "out/tiny/ckpt.pt")
    assert answer is not None and sorted(parses) == ["config.py", "configurator.py",
                                                     "train.py"]


def test_200_exec_mentions_are_parsed_once(tmp_path: Path, parses: list[str]) -> None:
    train = TRAIN.replace(EXEC, EXEC * 200)
    assert train.count(EXEC) == 200
    tree = _tree(tmp_path, train)
    assert resume_convention_argv(tree, ["python", "train.py"], "out/ckpt.pt") == [
        "python", "train.py", RESUME_WORD]
    assert sorted(parses) == ["configurator.py", "train.py"]


def test_ten_large_mentions_run_out_of_budget_and_cannot_tell(tmp_path: Path,
                                                              parses: list[str]) -> None:
    """Ten distinct files of nearly :data:`MAX_SOURCE` each, each a mention before the real
    configurator: the first is past the parse budget, so the answer is None, at once."""
    assert MAX_PARSED < MAX_SOURCE
    big = "x = 1\n" * ((MAX_SOURCE - 64) // 6)
    files = {f"big{i}.py": big + f"y = {i}\n" for i in range(10)}
    mentions = "".join(f"exec(open('big{i}.py').read())\n" for i in range(10))
    tree = _tree(tmp_path, TRAIN.replace(EXEC, mentions + EXEC), **files)
    started = time.monotonic()
    answer = resume_convention_argv(tree, ["python", "train.py"], "out/ckpt.pt")
    elapsed = time.monotonic() - started
    print(f"ten {len(big):,}-byte mentions: {elapsed:.3f} s, parsed {parses}")
    assert answer is None
    assert parses == ["train.py"]  # none of the big files was parsed
    # The control: the same script without the big mentions is answered.
    (tree / "train.py").write_text(TRAIN)
    assert resume_convention_argv(tree, ["python", "train.py"], "out/ckpt.pt") is not None


def test_more_distinct_files_than_the_budget_cannot_tell(tmp_path: Path) -> None:
    configs = {f"c{i}.py": f"out_dir = 'out/c{i}'\n" for i in range(MAX_FILES + 5)}
    tree = _tree(tmp_path, **configs)
    names = sorted(configs, key=lambda n: int(n[1:-3]))
    within = names[:MAX_FILES - 2]  # the script and its configurator are read too
    last = within[-1][:-3]
    assert resume_convention_argv(tree, ["python", "train.py", *within],
                                  f"out/{last}/ckpt.pt") is not None
    assert resume_convention_argv(tree, ["python", "train.py", *names],
                                  f"out/{names[-1][:-3]}/ckpt.pt") is None


def test_a_file_changed_between_answers_is_read_again(tmp_path: Path) -> None:
    """The cache lives for one answer: a config edited since is read afresh."""
    tree = _tree(tmp_path, **{"config.py": CONFIG})
    argv = ["python", "train.py", "config.py"]
    assert resume_convention_argv(tree, argv, "out/tiny/ckpt.pt") is not None
    (tree / "config.py").write_text("out_dir = 'elsewhere'\n")
    assert resume_convention_argv(tree, argv, "out/tiny/ckpt.pt") is None
    assert resume_convention_argv(tree, argv, "elsewhere/ckpt.pt") is not None
