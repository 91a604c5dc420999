"""``manifest diff``: rule coverage, keyed lists, refinements, CLI, JSON shape, imports."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from manifest.canonical import dumps, seal
from manifest.cli import main
from manifest.diff.engine import DERIVED_FIELDS, diff_manifests
from manifest.diff.result import JSON_FORMAT, ChangeKind
from manifest.diff.rules import FALLBACK_RULE, RULES, Impact
from manifest.diff.walk import KEYED_LISTS, OPAQUE_LISTS, SET_LISTS, rule_for
from manifest.models import Manifest
from tests.golden.diff import make_pairs

GOLDEN = Path(__file__).parent / "golden" / "diff"


PAIRS = make_pairs


def build(edit: Any = None) -> Manifest:
    doc = copy.deepcopy(PAIRS.base())
    if edit is not None:
        edit(doc)
    manifest: Manifest = seal(doc)
    return manifest


# ------------------------------------------------------------ rule coverage
# An independent walk of the model annotations: every path the diff can
# report (leaves, optional containers, dict entries, keyed-list elements).


def _unwrap(tp: Any) -> tuple[Any, bool]:
    optional = False
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(tp))
            if len(args) != 1:
                return tp, optional
            tp = args[0]
        else:
            return tp, optional


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _model_patterns(model: type[BaseModel], prefix: str) -> Iterator[str]:
    for name, info in model.model_fields.items():
        field_name = info.alias or name
        path = f"{prefix}.{field_name}" if prefix else field_name
        if not prefix and field_name in DERIVED_FIELDS:
            continue
        if prefix.endswith("[*]") and KEYED_LISTS.get(prefix[:-3]) == name:
            continue  # the natural key names the element; it never differs on its own
        yield from _patterns(info.annotation, path)


def _patterns(annotation: Any, path: str) -> Iterator[str]:
    tp, optional = _unwrap(annotation)
    origin = typing.get_origin(tp)
    if _is_model(tp):
        if optional:
            yield path
        yield from _model_patterns(tp, path)
    elif origin is dict:
        if optional:
            yield path
        yield f"{path}[*]"
        value, _ = _unwrap(typing.get_args(tp)[1])
        if _is_model(value):
            yield from _model_patterns(value, f"{path}[*]")
    elif origin is list:
        element, _ = _unwrap(typing.get_args(tp)[0])
        if _is_model(element):
            assert path in KEYED_LISTS or path in OPAQUE_LISTS, (
                f"list of models {path} has no natural key")
            if path in OPAQUE_LISTS:  # compared as one value
                yield path
                return
            if optional:
                yield path
            yield f"{path}[*]"
            yield from _model_patterns(element, f"{path}[*]")
        elif path in SET_LISTS:
            if optional:
                yield path
            yield f"{path}[*]"
        else:
            yield path
    else:
        yield path


ALL_PATTERNS = sorted(set(_model_patterns(Manifest, "")))


def test_walk_sees_every_section() -> None:
    sections = {p.split(".")[0].split("[")[0] for p in ALL_PATTERNS}
    assert sections == {"schema", "code", "data", "env", "hardware", "randomness",
                        "determinism", "command", "outputs", "observed"}
    assert len(ALL_PATTERNS) > 100


@pytest.mark.parametrize("pattern", ALL_PATTERNS)
def test_every_model_field_has_a_rule(pattern: str) -> None:
    name, rule = rule_for(pattern, pattern)
    assert rule is not FALLBACK_RULE, f"{pattern} is not in manifest.diff.rules.RULES"
    assert name == pattern


def test_no_rule_is_stale() -> None:
    known = set(ALL_PATTERNS)
    for name in RULES:
        general = re.sub(r"\[[^\]*][^\]]*\]", "[*]", name)
        assert general in known, f"rule {name} matches no model field"


def test_fields_not_in_the_table_default_to_bits() -> None:
    name, rule = rule_for("env.brand_new_field", "env.brand_new_field")
    assert name == "(default)"
    assert rule.impact is Impact.BITS


def test_observed_is_all_benign_and_identity_mostly_bits() -> None:
    for name, rule in RULES.items():
        if name.startswith("observed."):
            assert rule.impact is Impact.BENIGN, name
    for name in ("randomness.seed", "env.torch", "env.cudnn", "hardware.gpus[*].name",
                 "determinism.num_threads", "data[*].root", "code.diff_digest"):
        assert RULES[name].impact is Impact.BITS, name


# ------------------------------------------------------------- the diff


def test_diff_of_a_manifest_with_itself_is_empty() -> None:
    a = build()
    result = diff_manifests(a, a)
    assert result.differences == ()
    assert result.verdict == "identical"
    assert result.nondeterminism is None


def test_reordered_keyed_lists_are_not_differences() -> None:
    def reorder(doc: dict[str, Any]) -> None:
        doc["data"].reverse()
        doc["hardware"]["cpu_isa"].reverse()
        doc["env"]["packages"] = dict(reversed(list(doc["env"]["packages"].items())))

    assert diff_manifests(build(), build(reorder)).differences == ()


def test_one_changed_package_is_one_line() -> None:
    def bump(doc: dict[str, Any]) -> None:
        doc["env"]["packages"]["sympy"] = "1.13.1"
        doc["env"]["packages_digest"] = PAIRS.d("other")

    result = diff_manifests(build(), build(bump))
    assert [d.path for d in result.differences] == ["env.packages[sympy]"]
    (only,) = result.differences
    assert only.reason == "package sympy 1.13.0 → 1.13.1: installed libraries differ"
    assert only.location == ("env", "packages", "sympy")


def test_packages_digest_alone_is_reported() -> None:
    def digest_only(doc: dict[str, Any]) -> None:
        doc["env"]["packages_digest"] = PAIRS.d("other")

    result = diff_manifests(build(), build(digest_only))
    assert [d.path for d in result.differences] == ["env.packages_digest"]
    assert result.has_bits


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda doc: doc["env"].update(cudnn="9.3.0"),
         "cuDNN 9.1.0 → 9.3.0: convolution kernels may change"),
        (lambda doc: doc["env"]["variables"].update(OMP_NUM_THREADS="1"),
         "OMP_NUM_THREADS 2 → 1: CPU reduction order changes"),
        # the two runs' outputs are identical here: a seed acts only through the draws
        (lambda doc: doc["randomness"].update(seed=43),
         "seed 42 → 43 (could change the bits; here the outputs are identical)"),
        (lambda doc: doc["env"]["variables"].pop("PYTHONHASHSEED"),
         "PYTHONHASHSEED 0 → unset: set and dict iteration order changes"),
        (lambda doc: doc["env"]["variables"].update(NCCL_MIN_NCHANNELS="4"),
         "NCCL_MIN_NCHANNELS unset → 4: allow-listed because it can change numerics"),
        (lambda doc: doc["hardware"]["cpu_isa"].append("avx512f"),
         "CPU ISA flag avx512f absent → present: CPU kernels are dispatched on it"),
        (lambda doc: doc["command"].update(argv=["python", "train.py", "--lr", "3e-4"]),
         "command line python train.py --epochs 2 → python train.py --lr 3e-4: "
         "a different program or arguments"),
        (lambda doc: doc["hardware"].update(gpus=None, gpu_count=0),
         "GPUs NVIDIA A100-SXM4-80GB → none: different devices"),
    ],
)
def test_reasons_read_like_sentences(edit: Any, reason: str) -> None:
    result = diff_manifests(build(), build(edit))
    assert reason in [d.reason for d in result.differences]


def test_identical_outputs_settle_seed_lines_but_not_code_or_library_lines() -> None:
    from manifest.errors import EXIT_FAILED, EXIT_OK

    seeded = diff_manifests(build(), build(lambda doc: doc["randomness"].update(seed=43)))
    assert seeded.has_bits and seeded.outputs == "identical"
    assert (seeded.exit_code, seeded.to_json()["outputs"]) == (EXIT_OK, "identical")
    both = diff_manifests(build(), build(lambda doc: (doc["randomness"].update(seed=43),
                                                      doc["env"].update(torch="9.9.9"))))
    assert both.outputs == "identical" and both.exit_code == EXIT_FAILED
    assert "outputs" not in both.to_json()  # it decided nothing


def test_added_and_removed_are_relative_to_a() -> None:
    def add_dataset(doc: dict[str, Any]) -> None:
        doc["data"].append({"name": "extra", "path": "data/extra", "root": PAIRS.d("x"),
                            "files": 1, "bytes": 10, "listing": None})

    forward = diff_manifests(build(), build(add_dataset))
    backward = diff_manifests(build(add_dataset), build())
    assert [(d.path, d.change) for d in forward.differences] == [("data[extra]", ChangeKind.ADDED)]
    assert [(d.path, d.change) for d in backward.differences] == [
        ("data[extra]", ChangeKind.REMOVED)]
    assert forward.differences[0].before is None
    assert forward.differences[0].reason.startswith("dataset extra absent → ")


def test_duplicate_natural_keys_are_kept_apart() -> None:
    def duplicate(doc: dict[str, Any]) -> None:
        doc["data"].append({**doc["data"][0], "root": PAIRS.d("dup")})

    result = diff_manifests(build(), build(duplicate))
    assert [d.path for d in result.differences] == ["data[mnist#2]"]


def test_identical_tensors_downgrade_file_digest_to_benign() -> None:
    result = diff_manifests(build(PAIRS.container_metadata_a), build(PAIRS.container_metadata))
    assert result.differences
    assert not result.has_bits
    assert all("container metadata" in d.reason for d in result.differences)


def test_file_digest_without_tensor_table_is_bits() -> None:
    def no_tensors(tag: str) -> Any:
        def edit(doc: dict[str, Any]) -> None:
            art = doc["outputs"]["artifacts"][0]
            art.update(format="file", tensors=None, digest=PAIRS.d(tag))
        return edit

    result = diff_manifests(build(no_tensors("one")), build(no_tensors("two")))
    assert [d.impact for d in result.differences] == [Impact.BITS]


def test_same_run_id_different_outputs_says_so_first() -> None:
    result = diff_manifests(build(), build(PAIRS.same_run_id_outputs))
    assert result.same_run_id
    nd = result.nondeterminism
    assert nd is not None
    assert nd.message == ("same inputs, different weights: not deterministic, or an input "
                          "the record misses")
    assert nd.tensors == (("model.safetensors", "fc.weight"),
                          ("model.safetensors", "norm.running_mean"))
    assert nd.first_divergent_step == 200


def test_different_run_id_is_not_called_nondeterministic() -> None:
    assert diff_manifests(build(), build(PAIRS.seed_change)).nondeterminism is None


def test_bits_come_first_then_section_order() -> None:
    result = diff_manifests(build(), build(PAIRS.seed_change))
    impacts = [d.impact for d in result.differences]
    assert impacts == sorted(impacts, key=lambda i: i is not Impact.BITS)
    sections = [d.section for d in result.bits]
    assert sections.index("randomness") < sections.index("outputs")


# -------------------------------------------------------------------- CLI


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(dumps(build()))
    b.write_bytes(dumps(build(PAIRS.torch_version)))
    return a, b


def test_cli_json_shape(pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = pair
    assert main(["diff", str(a), str(b), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["format", "a", "b", "same_run_id", "verdict", "counts", "only",
                         "nondeterminism", "differences"]
    assert doc["format"] == JSON_FORMAT
    assert doc["a"]["file"] == str(a)
    assert doc["verdict"] == "bits"
    first = doc["differences"][0]
    assert list(first) == ["section", "path", "location", "rule", "change", "impact", "reason",
                           "before", "after"]
    assert first == {
        "section": "env", "path": "env.torch", "location": ["env", "torch"], "rule": "env.torch",
        "change": "changed", "impact": "bits", "before": "2.4.0", "after": "2.5.1",
        "reason": "torch 2.4.0 → 2.5.1: kernels and defaults may change",
    }


def test_cli_only_filters_rows_not_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(dumps(build()))
    b.write_bytes(dumps(build(PAIRS.gpu_sku)))
    assert main(["diff", str(a), str(b), "--json", "--only", "benign"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["only"] == "benign"
    assert {d["impact"] for d in doc["differences"]} == {"benign"}
    assert doc["counts"] == {"bits": 2, "benign": 1}
    assert main(["diff", str(a), str(b), "--only", "bits"]) == 1
    out = capsys.readouterr().out
    assert "H100" in out
    assert "GPU boards" not in out


def test_cli_table_folds_long_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def many(tag: str) -> Any:
        def edit(doc: dict[str, Any]) -> None:
            doc["outputs"]["artifacts"][0]["tensors"] = {
                f"layer{i}.weight": {"dtype": "float32", "shape": [4],
                                     "digest": PAIRS.d(f"{tag}{i}")} for i in range(40)}
        return edit

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(dumps(build(many("a"))))
    b.write_bytes(dumps(build(many("b"))))
    assert main(["diff", str(a), str(b)]) == 1
    folded = capsys.readouterr().out
    assert "32 more like this" in folded
    assert main(["diff", str(a), str(b), "--all"]) == 1
    assert "layer39.weight" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["diff", "missing.json", "missing.json"], "manifest file missing.json does not exist"),
        (["diff", "-", "-"], "only one of the two manifests can be read from stdin"),
        (["diff", "--only", "everything", "a", "b"], "invalid choice"),
    ],
)
def test_cli_bad_usage_exits_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
    assert "Traceback" not in captured.err


def test_cli_invalid_json_names_the_file(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = pair
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["diff", str(a), str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"manifest: {bad}: manifest is not valid JSON")


# ---------------------------------------------------------------- imports


def test_diff_imports_no_torch_git_pynvml_or_numpy(pair: tuple[Path, Path]) -> None:
    a, b = pair
    script = (
        "import sys\n"
        "from manifest.cli import main\n"
        f"codes = [main(['diff', {str(a)!r}, {str(b)!r}]),\n"
        f"         main(['diff', {str(a)!r}, {str(b)!r}, '--json'])]\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('torch', 'git', 'pynvml', 'numpy'))\n"
        "sys.stderr.write(repr((codes, heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)
    assert done.stderr == "([1, 1], [])"


def test_runs_on_other_devices_get_no_numeric_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run on a GPU against one on CPU, otherwise alike, whose weights differ: diff says
    why no envelope judges (numeric.precision.device_change), as verify does; the names
    are the manifests' authors' and print escaped."""
    def on_cpu(doc: dict[str, Any]) -> None:
        for process in doc["determinism"]["processes"]:
            process.update(devices=[], cuda_runtime=None, cudnn=None, nccl=None)
        doc["outputs"]["artifacts"][0]["tensors"]["fc.bias"]["digest"] = PAIRS.d("moved")

    def on_gpu(name: str) -> Any:
        def edit(doc: dict[str, Any]) -> None:
            for process in doc["determinism"]["processes"]:
                process["devices"] = [name]
        return edit

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(dumps(build(on_gpu("NVIDIA H100 [bold]80GB[/bold] \x1b[31mHBM3"))))
    b.write_bytes(dumps(build(on_cpu)))
    assert main(["diff", str(a), str(b), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["outputs"] == "differ" and doc["numeric"]["verdict"] == "not-compared"
    assert doc["numeric"]["reason"].startswith("the run computed on 'NVIDIA H100 [bold]80GB")
    assert main(["diff", str(a), str(b)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "No numeric verdict: the run computed on" in out
    assert "[bold]80GB[/bold]" in out and "\x1b[31m" not in out

    def moved_on_gpu(doc: dict[str, Any]) -> None:
        on_cpu(doc)
        on_gpu("NVIDIA H100 80GB HBM3")(doc)

    # control: the same devices on both sides, weights apart, no envelope: nothing said
    a.write_bytes(dumps(build(on_gpu("NVIDIA H100 80GB HBM3"))))
    b.write_bytes(dumps(build(moved_on_gpu)))
    assert main(["diff", str(a), str(b), "--json"]) == 1
    assert "numeric" not in json.loads(capsys.readouterr().out)
