"""The process record on the wire: what the boot side writes is what ``ProcessRecord`` declares.

One real run under the launcher (a tiny torch script on CPU that seeds, sets a switch,
reads a variable, starts a DataLoader worker, a ``python -S`` child and a prepared child
without torch, logs and saves a checkpoint) writes real records; every key of them, nested
parts included, must be declared in ``manifest.launch.boot._manifest_wire.ProcessRecord``.
The script also writes one key nobody declared, the way a callback reaches the record
(``manifest.integrations._locators``): the positive control, which the check must name.

The host side: every declared key is read somewhere in the host's modules (a subscript,
``.get`` or ``in`` with the key, or with a module constant that spells it), except the
keys ``UNREAD_KEYS`` lists with a reason; a key in that list that the host does read
fails too, so the list stays true.
"""

from __future__ import annotations

import ast
import json
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from manifest.launch.boot import _manifest_wire as wire
from manifest.launch.runner import LaunchSettings, run_under_launcher
from tests.runs import make_repo

REPO = Path(__file__).resolve().parents[1]
SMUGGLED = "smuggled_by_the_script"

SCRIPT = f'''\
import os, random, subprocess, sys
import numpy as np
import torch
import manifest

random.seed(3)
torch.manual_seed(1)
torch.use_deterministic_algorithms(True)
os.environ.get("HOME")
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    opt.step()
    manifest.log(loss=loss.item())
data = torch.utils.data.TensorDataset(torch.randn(8, 4))
for _ in torch.utils.data.DataLoader(data, batch_size=4, num_workers=1):
    pass
torch.save(model.state_dict(), "ck.pt")
subprocess.run([sys.executable, "-S", "-c", "pass"], check=True)
subprocess.run([sys.executable, "-c", "import random; random.random()"], check=True)
sys.modules["_manifest_state"].state["record"]["{SMUGGLED}"] = 1
'''


def undeclared(value: Any, tp: Any, where: str) -> list[str]:
    """Keys in ``value`` that the type ``tp`` does not declare, as dotted paths."""
    if is_typeddict(tp):
        if not isinstance(value, dict):
            return []
        hints = get_type_hints(tp)
        out = [f"{where}.{k}".lstrip(".") for k in value if k not in hints]
        for key, item in value.items():
            if key in hints:
                out += undeclared(item, hints[key], f"{where}.{key}".lstrip("."))
        return out
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return [p for arm in get_args(tp) if arm is not type(None)
                for p in undeclared(value, arm, where)]
    if origin in (typing.NotRequired, typing.Required):
        return undeclared(value, get_args(tp)[0], where)
    if origin is list and isinstance(value, list):
        return [p for item in value for p in undeclared(item, get_args(tp)[0], f"{where}[]")]
    if origin is dict and isinstance(value, dict):
        return [p for item in value.values()
                for p in undeclared(item, get_args(tp)[1], f"{where}{{}}")]
    return []


def host_reads() -> set[str]:
    """String keys the host's modules read from a mapping: ``x["k"]``, ``x.get("k")``,
    ``"k" in x``, directly or through a module-level constant (``TRACKERS_KEY``)."""
    files = [p for p in (REPO / "manifest").rglob("*.py")
             if "boot" not in p.relative_to(REPO / "manifest").parts]
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in files]
    constants = {name: getattr(wire, name) for name in dir(wire)
                 if name.isupper() and isinstance(getattr(wire, name), str)}
    for tree in trees:
        for stmt in tree.body:
            if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)):
                constants.update({t.id: stmt.value.value for t in stmt.targets
                                  if isinstance(t, ast.Name)})

    def text(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    read: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            keys: list[ast.AST] = []
            if isinstance(node, ast.Subscript):
                keys = [node.slice]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("get", "setdefault", "pop") and node.args):
                keys = [node.args[0]]
            elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
                keys = [node.left]
            read.update(k for k in map(text, keys) if k is not None)
    return read


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every process's record as written: copied out of the private directory before it
    goes (the host keeps only the ranks' records)."""
    repo = make_repo(tmp_path_factory.mktemp("wire"), {"wire.py": SCRIPT}, example=False)
    kept = tmp_path_factory.mktemp("records")
    settings = LaunchSettings(seed=1, derivation="base+rank", threads=1, deterministic=True,
                              root=str(repo))

    def keep(argv: list[str], records_dir: Path) -> list[str]:
        return ["sh", "-c", 'python wire.py && cp "$0"/*.json "$1"', str(records_dir),
                str(kept)]

    result = run_under_launcher(["python", "wire.py"], repo, settings, wrap=keep)
    assert result.exit_code == 0
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(kept.glob("*.json"))]


@pytest.mark.slow
def test_every_key_the_boot_side_writes_is_declared(records: list[dict[str, Any]]) -> None:
    main, *children = sorted(records, key=lambda r: r["argv0"] == "-c")
    assert [c["argv0"] for c in children] == ["-c"]  # the child without torch
    assert undeclared(children[0], wire.ProcessRecord, "") == []
    record = main
    # The script exercised the observers: these keys are only written when it does.
    assert {"reseeds", "switches", "loaders", "outside", "checkpoints", "log"} <= set(record)
    assert record["log"] and record["checkpoints"] and record["reseeds"]
    # Positive control: the one key the script smuggled in is named, and nothing else.
    assert undeclared(record, wire.ProcessRecord, "") == [SMUGGLED]
    # Each nested part was checked too: an extra key inside one is named by its path.
    nested = dict(record, checkpoints=[dict(record["checkpoints"][0], extra=1)],
                  at_start=dict(record["at_start"], gpu=""))
    nested.pop(SMUGGLED)
    assert sorted(undeclared(nested, wire.ProcessRecord, "")) == ["at_start.gpu",
                                                                  "checkpoints[].extra"]


def test_the_host_reads_every_declared_key() -> None:
    read = host_reads()
    declared = set(wire.RECORD_KEYS)
    assert set(wire.UNREAD_KEYS) <= declared
    assert declared - set(wire.UNREAD_KEYS) - read == set()
    # Positive control: the scan does not find every key; the unread ones stay unfound
    # (and one the host starts to read must come off the list).
    assert set(wire.UNREAD_KEYS) & read == set(), "read now: take it off UNREAD_KEYS"


def test_the_declared_keys_are_the_type_hints() -> None:
    """``RECORD_KEYS`` is the TypedDict's own key set, and every nested part resolves."""
    hints = get_type_hints(wire.ProcessRecord)
    assert set(hints) == set(wire.RECORD_KEYS)
    assert wire.TRACKERS_KEY in hints
