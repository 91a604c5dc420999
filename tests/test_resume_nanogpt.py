"""nanoGPT's resume convention: ``--init_from=resume`` from the one ``<out_dir>/ckpt.pt``.

The detector (``manifest.verify.conventions``) reads the script and its configurator
with ``ast``, never runs them; the launcher proves the resume by the load itself
(``torch.load`` of ``MANIFEST_RESUME_FROM``'s file records ``resumed_from``). The
end-to-end run is nanoGPT-shaped: module-level settings, a poor man's configurator,
one ``ckpt.pt`` overwritten at every save; only the last save is kept, so the stretch
it starts is the one replayed.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from manifest.verify.conventions import MAX_SOURCE, resume_convention_argv
from tests.runs import make_repo, manifest_cli

CONFIGURATOR = """# --key=value words override this script's globals; other words are config files.
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if '=' not in arg:
        assert not arg.startswith('--')
        exec(open(arg).read())
    else:
        assert arg.startswith('--')
        key, val = arg.split('=')
        key = key[2:]
        if key not in globals():
            raise ValueError(f"Unknown config key: {key}")
        try:
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val
        assert type(attempt) == type(globals()[key])
        globals()[key] = attempt
"""

TRAIN = """# A nanoGPT-shaped trainer: settings as globals, one ckpt.pt saved every eval_interval.
import os

import torch

out_dir = 'out'
init_from = 'scratch'  # 'scratch' or 'resume'
max_iters = 30
eval_interval = 8
batch_size = 4
exec(open('configurator.py').read())

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
iter_num = 0
if init_from == 'scratch':
    pass
elif init_from == 'resume':
    checkpoint = torch.load(os.path.join(out_dir, 'ckpt.pt'))
    model.load_state_dict(checkpoint['model'])
    optimizer.load_state_dict(checkpoint['optimizer'])
    iter_num = checkpoint['iter_num']
    torch.set_rng_state(checkpoint['rng'])  # nanoGPT itself does not: its batches would part

while True:
    if iter_num % eval_interval == 0 and iter_num > 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                    'iter_num': iter_num, 'rng': torch.get_rng_state()},
                   os.path.join(out_dir, 'ckpt.pt'))
    x = torch.randn(batch_size, 8)
    loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    iter_num += 1
    if iter_num >= max_iters:
        break
"""

RESUME_BRANCH = """    checkpoint = torch.load(os.path.join(out_dir, 'ckpt.pt'))
    model.load_state_dict(checkpoint['model'])
    optimizer.load_state_dict(checkpoint['optimizer'])
    iter_num = checkpoint['iter_num']
    torch.set_rng_state(checkpoint['rng'])  # nanoGPT itself does not: its batches would part
"""
IGNORES_RESUME = TRAIN.replace(RESUME_BRANCH, "    print('asked to resume; starting over')\n")
assert IGNORES_RESUME != TRAIN

CONFIG = "# a config file, as config/train_shakespeare_char.py\nout_dir = 'out/tiny'\n"


def _tree(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir(exist_ok=True)
    for name, text in {"train.py": TRAIN, "configurator.py": CONFIGURATOR,
                       **(files or {})}.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    return tree


# ------------------------------------------------------------------ detector: yes


def test_nanogpt_script_resumes_with_init_from(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    assert resume_convention_argv(tree, ["python", "train.py"], "out/ckpt.pt") == [
        "python", "train.py", "--init_from=resume"]
    assert resume_convention_argv(tree, ["python", "train.py"], "./out/ckpt.pt") == [
        "python", "train.py", "--init_from=resume"]


def test_recorded_init_from_is_replaced_and_the_resume_word_comes_last(tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"config/c.py": "init_from = 'gpt2'\n"})
    argv = ["python", "train.py", "--init_from=scratch", "config/c.py", "--max_iters=30"]
    assert resume_convention_argv(tree, argv, "out/ckpt.pt") == [
        "python", "train.py", "config/c.py", "--max_iters=30", "--init_from=resume"]


def test_out_dir_comes_from_argv_and_config_files_in_order(tmp_path: Path) -> None:
    tree = _tree(tmp_path, {"config/tiny.py": CONFIG, "config/plain.py": "max_iters = 4\n"})
    run = ["python", "train.py"]
    assert resume_convention_argv(tree, [*run, "--out_dir=o2"], "o2/ckpt.pt") is not None
    assert resume_convention_argv(tree, [*run, "--out_dir='o 3'"], "o 3/ckpt.pt") is not None
    assert resume_convention_argv(tree, [*run, "--out_dir=o2"], "out/ckpt.pt") is None
    assert resume_convention_argv(tree, [*run, "config/tiny.py"], "out/tiny/ckpt.pt") is not None
    assert resume_convention_argv(tree, [*run, "config/tiny.py"], "out/ckpt.pt") is None
    # The configurator applies the words in order: the last one that sets out_dir wins.
    assert resume_convention_argv(tree, [*run, "config/tiny.py", "--out_dir=o2"],
                                  "o2/ckpt.pt") is not None
    assert resume_convention_argv(tree, [*run, "--out_dir=o2", "config/tiny.py"],
                                  "out/tiny/ckpt.pt") is not None
    # A config file that leaves out_dir alone leaves the default.
    assert resume_convention_argv(tree, [*run, "config/plain.py"], "out/ckpt.pt") is not None


def test_launch_lines_torchrun_and_interpreter_options(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    for argv in (["torchrun", "--standalone", "--nproc_per_node", "2", "train.py"],
                 ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"],
                 ["python3.11", "-u", "-X", "dev", "train.py"],
                 ["/usr/bin/python3", "train.py"], ["env", "A=1", "python", "train.py"]):
        assert resume_convention_argv(tree, argv, "out/ckpt.pt") == [*argv, "--init_from=resume"]
    for argv in (["python", "-m", "train"], ["python", "-c", "import train"],
                 ["bash", "run.sh"], []):
        assert resume_convention_argv(tree, argv, "out/ckpt.pt") is None


def test_configurator_loop_inline_in_the_script(tmp_path: Path) -> None:
    loop = CONFIGURATOR.split("from ast import literal_eval\n", 1)[1]
    inline = TRAIN.replace("exec(open('configurator.py').read())\n",
                           "import sys\nfrom ast import literal_eval\n" + loop)
    tree = _tree(tmp_path, {"train.py": inline, "configurator.py": "# unused\n"})
    assert resume_convention_argv(tree, ["python", "train.py"], "out/ckpt.pt") is not None


# ------------------------------------------------------------------- detector: no


def _no(tmp_path: Path, script: str, argv: list[str] | None = None,
        files: dict[str, str] | None = None, checkpoint: str = "out/ckpt.pt") -> None:
    tree = _tree(tmp_path, {"train.py": script, **(files or {})})
    assert resume_convention_argv(tree, argv or ["python", "train.py"], checkpoint) is None


def test_not_the_fixed_path(tmp_path: Path) -> None:
    _no(tmp_path, TRAIN, checkpoint="out/ckpt-100.pt")
    _no(tmp_path, TRAIN, checkpoint="elsewhere/ckpt.pt")
    _no(tmp_path, TRAIN, argv=["python", "train.py", "--out_dir=/abs"])


def test_argparse_script_is_not_nanogpt_style(tmp_path: Path) -> None:
    _no(tmp_path, "import argparse\nimport torch\np = argparse.ArgumentParser()\n"
        "p.add_argument('--init_from', default='scratch')\n"
        "p.add_argument('--out_dir', default='out')\na = p.parse_args()\n"
        "if a.init_from == 'resume':\n    torch.load(a.out_dir + '/ckpt.pt')\n")


def test_init_from_only_in_a_comment_or_a_string(tmp_path: Path) -> None:
    script = TRAIN.replace("init_from = 'scratch'  # 'scratch' or 'resume'\n",
                           "# init_from = 'scratch'\nnote = \"init_from = 'scratch'\"\n")
    assert script != TRAIN
    _no(tmp_path, script)


def test_settings_bound_another_way(tmp_path: Path) -> None:
    exec_line = "exec(open('configurator.py').read())\n"
    for script in (
        TRAIN.replace("init_from = 'scratch'", "init_from = os.environ.get('INIT', 'scratch')"),
        TRAIN.replace("out_dir = 'out'", "out_dir = 'out' + ''"),
        TRAIN.replace(exec_line, exec_line + "init_from = 'scratch'\n"),  # undoes the argv
        TRAIN.replace(exec_line, exec_line + "if True:\n    out_dir = 'other'\n"),
        TRAIN.replace(exec_line, exec_line + "for out_dir in ['x']:\n    pass\n"),
        TRAIN.replace(exec_line, exec_line + "def f():\n    global out_dir\n    out_dir = 'x'\n"),
        TRAIN.replace(exec_line, exec_line + "[(out_dir := 'x') for _ in range(1)]\n"),
        TRAIN.replace("out_dir = 'out'\n", ""),  # no default to know the path by
    ):
        assert script != TRAIN
        _no(tmp_path, script)
    # A function's own local of that name is not the module's: still detected.
    local = TRAIN.replace(exec_line,
                          exec_line + "def f():\n    out_dir = 'x'\n    return out_dir\n")
    tree = _tree(tmp_path, {"train.py": local})
    assert resume_convention_argv(tree, ["python", "train.py"], "out/ckpt.pt") is not None


def test_no_configurator_no_resume_mode_no_ckpt_name(tmp_path: Path) -> None:
    exec_line = "exec(open('configurator.py').read())\n"
    _no(tmp_path, TRAIN.replace(exec_line, ""))
    _no(tmp_path, TRAIN.replace(exec_line, "exec(open('settings.py').read())\n"),
        files={"settings.py": "lr = 3e-4\n"})  # executes a file that takes no argv
    _no(tmp_path, TRAIN, files={"configurator.py": "import sys\nprint(sys.argv)\n"})
    _no(tmp_path, TRAIN.replace(exec_line, "exec(open('missing.py').read())\n"))
    _no(tmp_path, TRAIN.replace("init_from == 'resume'", "init_from == 'restart'"))
    _no(tmp_path, TRAIN.replace("'ckpt.pt'", "'state.pt'"))
    # The configurator must come after the defaults it overrides.
    moved = TRAIN.replace(exec_line, "").replace("import torch\n", "import torch\n" + exec_line)
    _no(tmp_path, moved)


def test_config_file_out_dir_unknown(tmp_path: Path) -> None:
    run = ["python", "train.py", "config/c.py"]
    for config in ("dataset = 'x'\nout_dir = 'out-' + dataset\n",
                   "import os\nif os.environ.get('X'):\n    out_dir = 'a'\n",
                   "out_dir = 'a'\nout_dir += 'b'\n",
                   "out_dir = 'a' if True else 'b'\n",
                   "def broken(:\n"):
        _no(tmp_path, TRAIN, argv=run, files={"config/c.py": config}, checkpoint="a/ckpt.pt")
    _no(tmp_path, TRAIN, argv=["python", "train.py", "config/missing.py"])
    _no(tmp_path, TRAIN, argv=["python", "train.py", "--out_dir"])  # the configurator refuses
    _no(tmp_path, TRAIN, argv=["python", "train.py", "--out_dir=3"], checkpoint="3/ckpt.pt")


def test_hostile_scripts(tmp_path: Path) -> None:
    _no(tmp_path, "def broken(:\n" + TRAIN)
    _no(tmp_path, TRAIN + "\x00\n")
    _no(tmp_path, "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n" + TRAIN)
    _no(tmp_path, "x = " + "-" * 200_000 + "1\n" + TRAIN)
    # A valid nanoGPT script past the size bound is not read at all.
    huge = TRAIN + "#" * (MAX_SOURCE - len(TRAIN.encode())) + "\n"
    assert len(huge.encode()) > MAX_SOURCE
    _no(tmp_path, huge)
    assert len(TRAIN.encode()) < MAX_SOURCE  # positive control
    tree = _tree(tmp_path, {"train.py": TRAIN})
    assert resume_convention_argv(tree, ["python", "train.py"], "out/ckpt.pt") is not None


def test_hostile_files_are_never_opened(tmp_path: Path) -> None:
    """A FIFO (a plain open would block), a directory, a dangling link: None, no wait."""
    tree = _tree(tmp_path)
    os.mkfifo(tree / "fifo.py")
    (tree / "dir.py").mkdir()
    (tree / "link.py").symlink_to(tree / "nowhere.py")
    os.mkfifo(tree / "config.py")
    answers: list[Any] = []

    def probe() -> None:
        for name in ("fifo.py", "dir.py", "link.py"):
            answers.append(resume_convention_argv(tree, ["python", name], "out/ckpt.pt"))
        answers.append(resume_convention_argv(tree, ["python", "train.py", "config.py"],
                                              "out/ckpt.pt"))

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the detector blocked on a FIFO"
    assert answers == [None, None, None, None]


# -------------------------------------------------------------- the load proves it


def _state_record() -> dict[str, Any]:
    from manifest.launch.boot._manifest_state import state

    state["record"] = {"errors": []}
    return state["record"]  # type: ignore[no-any-return]


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    from manifest.launch.boot._manifest_state import state

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MANIFEST_RESUME_FROM", "out/ckpt.pt")
    yield _state_record()
    state["record"] = None


def test_watched_load_records_only_the_given_file(record: dict[str, Any],
                                                  tmp_path: Path) -> None:
    import types

    from manifest.launch.boot import _manifest_checkpoints as ck

    seen: list[Any] = []

    def load(f: Any, **kwargs: Any) -> str:
        seen.append(f)
        if f == "bad":
            raise OSError("the user's own error")
        return "state"

    module = types.SimpleNamespace(load=load)
    ck.on_torch_serialization(module)
    assert module.load is not load
    ck.on_torch_serialization(module)  # wrapped once
    assert module.load("other.pt") == "state" and "resumed_from" not in record
    with pytest.raises(OSError, match="the user's own error"):
        module.load("bad")
    assert "resumed_from" not in record
    (tmp_path / "out").mkdir()
    assert module.load(f=tmp_path / "out" / "ckpt.pt") == "state"  # absolute, PathLike
    assert record["resumed_from"] == "out/ckpt.pt"
    del record["resumed_from"]
    with open(tmp_path / "out" / "x", "wb") as out:
        module.load(out)
    assert "resumed_from" not in record
    (tmp_path / "out" / "ckpt.pt").write_bytes(b"")
    with open("out/ckpt.pt", "rb") as fh:  # an open file, by its name
        module.load(fh)
    assert record["resumed_from"] == "out/ckpt.pt"
    assert record["errors"] == []


def test_no_variable_no_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from manifest.launch.boot import _manifest_checkpoints as ck

    monkeypatch.delenv("MANIFEST_RESUME_FROM", raising=False)

    def load(f: Any) -> None:
        return None

    module = types.SimpleNamespace(load=load)
    ck.on_torch_serialization(module)
    assert module.load is load


LOADS = """import sys
import torch
from torch import load
from safetensors.torch import load_file, save_file
torch.save({'w': torch.ones(2)}, 'other.pt')
torch.save({'w': torch.ones(2)}, 'ckpt.pt')
save_file({'w': torch.ones(2)}, 'model.safetensors')
how = sys.argv[1]
if how == 'torch':
    torch.load('ckpt.pt')
elif how == 'bound':
    load('./ckpt.pt')
elif how == 'file':
    with open('ckpt.pt', 'rb') as f:
        torch.load(f)
elif how == 'safetensors':
    load_file('model.safetensors')
else:
    torch.load('other.pt')
"""


def test_under_the_launcher_a_load_of_the_checkpoint_records_the_resume(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    from manifest.launch.runner import LaunchSettings, run_under_launcher

    (tmp_path / "loads.py").write_text(LOADS)
    settings = LaunchSettings(seed=0, derivation="same", threads=1, deterministic=True)
    for how, given, expect in (("torch", "ckpt.pt", "ckpt.pt"), ("bound", "ckpt.pt", "ckpt.pt"),
                               ("file", "ckpt.pt", "ckpt.pt"),
                               ("safetensors", "model.safetensors", "model.safetensors"),
                               ("other", "ckpt.pt", None)):
        env = {**os.environ, "MANIFEST_RESUME_FROM": given}
        ran = run_under_launcher([sys.executable, "loads.py", how], tmp_path, settings,
                                 base_env=env)
        assert ran.exit_code == 0, ran.records
        [rec] = ran.records
        assert rec.get("resumed_from") == expect, (how, rec.get("errors"))
        assert not rec["errors"], rec["errors"]


# ---------------------------------------------------------------------- end to end


def _captured(tmp_path: Path, script: str) -> Path:
    repo = make_repo(tmp_path / "repo", {"train.py": script, "configurator.py": CONFIGURATOR,
                                         "config/tiny.py": CONFIG}, example=False)
    cap = manifest_cli("capture", "--seed", "0", "--", "python", "train.py", "config/tiny.py",
                       "--init_from=scratch", "--max_iters=30", cwd=repo)
    assert cap.returncode == 0, cap.stderr.decode()
    (repo / "run.json").write_bytes(cap.stdout)
    checkpoints = json.loads(cap.stdout)["outputs"]["checkpoints"]
    # One file saved at 8, 16 and 24: only the last save is kept.
    assert [(c["step"], c["path"], c["artifact"] is not None) for c in checkpoints] == [
        (8, "out/tiny/ckpt.pt", False), (16, "out/tiny/ckpt.pt", False),
        (24, "out/tiny/ckpt.pt", True)]
    return repo


def _verify_at(repo: Path, step: int) -> tuple[int, dict[str, Any]]:
    out = manifest_cli("verify", "--trust", "run.json", "--at", str(step), "--format", "json",
                       cwd=repo)
    assert b"Traceback" not in out.stderr, out.stderr.decode()
    return out.returncode, json.loads(out.stdout)


@pytest.mark.slow
def test_nanogpt_run_replays_its_kept_stretch_bit_identically(tmp_path: Path) -> None:
    repo = _captured(tmp_path, TRAIN)
    code, doc = _verify_at(repo, 27)
    [seg] = doc["segments"]
    assert (seg["start"], seg["end"], seg["checkpoint"]) == (24, 30, "out/tiny/ckpt.pt")
    assert seg["verdict"] == "identical", seg
    assert seg["steps_compared"] == 6
    assert code == 0


@pytest.mark.slow
def test_script_that_ignores_init_from_is_named_as_not_resumed(tmp_path: Path) -> None:
    """The positive control: the detector says resume (the script has the convention's
    shape), the script starts over instead; with no load of the checkpoint, no verdict."""
    repo = _captured(tmp_path, IGNORES_RESUME)
    argv = ["python", "train.py", "config/tiny.py", "--init_from=scratch", "--max_iters=30"]
    assert resume_convention_argv(repo, argv, "out/tiny/ckpt.pt") == [
        *argv[:3], "--max_iters=30", "--init_from=resume"]
    code, doc = _verify_at(repo, 27)
    [seg] = doc["segments"]
    assert seg["verdict"] == "no-verdict"
    assert seg["reason"].startswith("the script did not resume"), seg
    assert code == 3


@pytest.mark.slow
def test_resume_audit_of_a_nanogpt_script(tmp_path: Path) -> None:
    """``lab --resume-at 8``: stopped after step 8, resumed through init_from=resume (no
    template), then compared with the uninterrupted run: the script carries its RNG, so the
    two agree step by step."""
    repo = _captured(tmp_path, TRAIN)
    out = manifest_cli("lab", "-q", "--resume-at", "8", "--format", "json", "--", "python",
                       "train.py", "config/tiny.py", "--init_from=scratch", "--max_iters=30",
                       cwd=repo)
    assert b"Traceback" not in out.stderr, out.stderr.decode()
    doc = json.loads(out.stdout)
    assert doc["resumed_command"][-1] == "--init_from=resume", doc
    assert doc["first_divergent_step"] is None and doc["steps_compared"] == 22, doc
    assert out.returncode == 0, out.stderr.decode()
