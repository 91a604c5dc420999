"""Properties of ``diff_manifests`` over generated manifests (hypothesis)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from manifest.canonical import seal
from manifest.diff.engine import diff_manifests
from manifest.diff.result import ChangeKind, ManifestDiff
from manifest.models import Manifest
from tests.golden.diff import make_pairs

GOLDEN = Path(__file__).parent / "golden" / "diff"


PAIRS = make_pairs

names = st.text("abcdefghij_-.", min_size=1, max_size=6)
versions = st.sampled_from(["1.0", "1.1", "2.0.1", "0.4.3"])
digests = st.sampled_from([PAIRS.d(str(i)) for i in range(4)])
counts = st.integers(0, 3)


@st.composite
def datasets(draw: st.DrawFn) -> list[dict[str, Any]]:
    chosen = draw(st.lists(names, unique=True, max_size=4))
    return [{"name": n, "path": f"data/{n}", "root": draw(digests), "files": draw(counts),
             "bytes": draw(counts), "listing": draw(st.none() | digests)} for n in chosen]


@st.composite
def gpus(draw: st.DrawFn) -> list[dict[str, Any]] | None:
    indexes = draw(st.none() | st.lists(st.integers(0, 3), unique=True, max_size=3))
    if indexes is None:
        return None
    return [{"index": i, "name": draw(st.sampled_from(["A100", "H100"])),
             "memory_bytes": draw(st.none() | counts), "compute_capability": "8.0",
             "mig_mode": draw(st.booleans()), "ecc_mode": None} for i in indexes]


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(PAIRS.base())
    doc["randomness"]["seed"] = draw(st.integers(0, 3))
    doc["env"]["packages"] = draw(st.dictionaries(names, versions, max_size=5))
    doc["env"]["variables"] = draw(st.dictionaries(
        st.sampled_from(["OMP_NUM_THREADS", "PYTHONHASHSEED", "NCCL_ALGO", "MKL_CBWR"]),
        st.sampled_from(["0", "1", "2"])))
    doc["env"]["cudnn"] = draw(st.none() | st.sampled_from(["9.1.0", "9.3.0"]))
    doc["data"] = draw(datasets())
    doc["hardware"]["gpus"] = draw(gpus())
    doc["hardware"]["cpu_isa"] = draw(st.lists(st.sampled_from(["avx", "avx2", "fma"]),
                                               unique=True))
    doc["determinism"]["num_threads"] = draw(st.none() | st.integers(1, 2))
    doc["command"] = draw(st.none() | st.just(doc["command"]))
    if draw(st.booleans()):
        doc["outputs"] = None
    else:
        doc["outputs"]["artifacts"][0]["tensors"] = draw(st.none() | st.dictionaries(
            names, st.fixed_dictionaries({"dtype": st.sampled_from(["float32", "bfloat16"]),
                                          "shape": st.lists(counts, max_size=2),
                                          "digest": digests}), max_size=4))
    doc["observed"]["duration_s"] = draw(st.floats(0, 10, allow_nan=False))
    return doc


def sealed(doc: dict[str, Any]) -> Manifest:
    manifest: Manifest = seal(doc)
    return manifest


def _paths(result: ManifestDiff) -> list[str]:
    return sorted(d.path for d in result.differences)


@settings(max_examples=60, deadline=None)
@given(manifests())
def test_diff_with_itself_is_empty(doc: dict[str, Any]) -> None:
    a = sealed(doc)
    assert diff_manifests(a, a).differences == ()
    assert diff_manifests(a, sealed(copy.deepcopy(doc))).differences == ()


@settings(max_examples=60, deadline=None)
@given(manifests(), manifests())
def test_diff_is_symmetric_in_paths(doc_a: dict[str, Any], doc_b: dict[str, Any]) -> None:
    a, b = sealed(doc_a), sealed(doc_b)
    forward, backward = diff_manifests(a, b), diff_manifests(b, a)
    assert _paths(forward) == _paths(backward)
    assert forward.has_bits == backward.has_bits
    swapped = {ChangeKind.ADDED: ChangeKind.REMOVED, ChangeKind.REMOVED: ChangeKind.ADDED,
               ChangeKind.CHANGED: ChangeKind.CHANGED}
    back = {d.path: d for d in backward.differences}
    for d in forward.differences:
        other = back[d.path]
        assert other.impact is d.impact
        assert other.change is swapped[d.change]
        assert (other.before, other.after) == (d.after, d.before)
        assert d.rule != "(default)"


@settings(max_examples=40, deadline=None)
@given(manifests(), st.randoms(use_true_random=False))
def test_list_order_is_not_a_difference(doc: dict[str, Any], rng: Any) -> None:
    shuffled = copy.deepcopy(doc)
    rng.shuffle(shuffled["data"])
    rng.shuffle(shuffled["hardware"]["cpu_isa"])
    if shuffled["hardware"]["gpus"]:
        rng.shuffle(shuffled["hardware"]["gpus"])
    assert diff_manifests(sealed(doc), sealed(shuffled)).differences == ()
