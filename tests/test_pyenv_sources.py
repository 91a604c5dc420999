"""Hostile environment records are refused in one sentence before anything runs; each case
has a positive control (the same record with an honest value passes), and the installer is
shown to act on the planted value when it is not stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from manifest.pyenv.sources import (
    HostileRecordError,
    check_url,
    pins_of,
    plan_sources,
    rebuild_set,
)
from manifest.trust import TrustDecision

HONEST: dict[str, Any] = {"version": "1.0", "tags": ["py3-none-any"], "installer": "pip",
                          "direct_url": None, "files": "blake3:" + "0" * 64}
UNTRUSTED = TrustDecision(False, "refused", "refused")
TRUSTED = TrustDecision(True, "--trust", "user")

# (case, name, record fields changed, words of the sentence)
HOSTILE = [
    ("option-name", "--index-url=http://127.0.0.1:9/", {}, "read as an option"),
    ("path-name", "../../etc", {}, "is a path"),
    ("slash-name", "evil/x", {}, "is a path"),
    ("bad-name", "a b", {}, "not a valid distribution name"),
    ("bad-version", "alpha", {"version": "1.0 --find-links /tmp"}, "not a valid version"),
    ("option-version", "alpha", {"version": "--pre"}, "not a valid version"),
    ("bad-tag", "alpha", {"tags": ["py3-none-any --no-index"]}, "not a wheel tag"),
    ("credentials", "alpha", {"direct_url": {
        "url": "https://user:s3cret@example.org/alpha-1.0-py3-none-any.whl"}},
        "carries credentials"),
    ("token-query", "alpha", {"direct_url": {
        "url": "https://example.org/alpha-1.0-py3-none-any.whl?token=abc"}},
        "carries credentials"),
    ("scheme", "alpha", {"direct_url": {"url": "ftp://example.org/alpha-1.0-py3-none-any.whl"}},
     "only https, http and file"),
    ("file-other-host", "alpha", {"direct_url": {
        "url": "file://fileserver/share/alpha-1.0-py3-none-any.whl"}}, "on another host"),
    ("bad-hash", "alpha", {"direct_url": {"url": "https://example.org/alpha-1.0-py3-none-any.whl",
                                          "archive_hash": "sha256=../../x"}}, "not a sha256"),
    ("bad-commit", "alpha", {"direct_url": {"url": "git+https://example.org/a.git",
                                            "vcs": "git", "commit_id": "--upload-pack=x"}},
     "not a commit id"),
]


@pytest.mark.parametrize(("case", "name", "fields", "words"), HOSTILE,
                         ids=[c[0] for c in HOSTILE])
def test_a_hostile_record_is_refused_in_one_sentence(case: str, name: str,
                                                    fields: dict[str, Any], words: str) -> None:
    with pytest.raises(HostileRecordError) as caught:
        pins_of({name: dict(HONEST, **fields)}, tree=Path("/nonexistent-tree"))
    message = caught.value.diagnostics()
    assert words in message and message.endswith(".") and "\n" not in message
    assert "s3cret" not in message and "abc" not in message
    # positive control: the same record, honest, passes
    honest = pins_of({"alpha": HONEST}, tree=Path("/nonexistent-tree"))
    assert [(p.name, p.version) for p in honest] == [("alpha", "1.0")]


def test_the_honest_direct_urls_pass() -> None:
    pins = pins_of({
        "wheel": dict(HONEST, direct_url={
            "url": "https://example.org/wheel-1.0-py3-none-any.whl",
            "archive_hash": "sha256=" + "a" * 64}),
        "vcs-dist": dict(HONEST, direct_url={"url": "git+https://example.org/a.git",
                                             "vcs": "git", "commit_id": "b" * 40}),
        "project": dict(HONEST, direct_url={"url": "file:///home/author/project",
                                            "editable": True}),
    }, tree=None)
    kinds = {p.name: (p.kind, p.sha256) for p in pins}
    assert kinds == {"project": ("built-here", None), "vcs-dist": ("built-here", None),
                     "wheel": ("archive", "a" * 64)}


def test_a_file_url_outside_the_tree_is_never_read(tmp_path: Path) -> None:
    """A wheel the author installed from a file: inside the tree it is the source; outside,
    it is shown as not used and looked for by name with its hash."""
    tree = tmp_path / "tree"
    (tree / "wheels").mkdir(parents=True)
    inside = (tree / "wheels" / "alpha-1.0-py3-none-any.whl").as_uri()
    outside = "file:///etc/alpha-1.0-py3-none-any.whl"
    record = dict(HONEST, direct_url={"url": inside, "archive_hash": "sha256=" + "c" * 64})
    [pin] = pins_of({"alpha": record}, tree=tree)
    assert (pin.kind, pin.url) == ("archive", inside)
    record = dict(HONEST, direct_url={"url": outside, "archive_hash": "sha256=" + "c" * 64})
    [pin] = pins_of({"alpha": record}, tree=tree)
    assert (pin.kind, pin.url, pin.sha256) == ("index", None, "c" * 64)
    plan = plan_sources(None, trust=TRUSTED, tree=tree, pins=[pin])
    assert plan.withheld == (outside,)
    with pytest.raises(HostileRecordError, match="outside the project's tree"):
        check_url(outside, what="a URL", tree=tree)
    assert check_url(inside, what="a URL", tree=tree) == inside


def test_user_sources_are_checked_and_recorded_ones_need_trust(tmp_path: Path) -> None:
    recorded = {"indexes": ["https://download.example.org/whl/cpu"],
                "find_links": ["/opt/author-wheels"], "origin": "pip config"}
    plan = plan_sources(recorded, find_links=[tmp_path], trust=UNTRUSTED, tree=tmp_path)
    assert plan.find_links == (str(tmp_path.resolve()),) and plan.index_urls == ()
    assert "https://download.example.org/whl/cpu" in plan.withheld
    trusted = plan_sources(recorded, trust=TRUSTED, tree=tmp_path)
    assert trusted.index_urls == ("https://download.example.org/whl/cpu",)
    assert trusted.withheld == ("file:///opt/author-wheels",)  # the author's folder
    with pytest.raises(HostileRecordError, match="not a folder"):
        plan_sources(None, find_links=[tmp_path / "missing"], trust=UNTRUSTED, tree=tmp_path)
    with pytest.raises(HostileRecordError, match="carries credentials"):
        plan_sources({"indexes": ["https://u:p@example.org/simple"]}, trust=TRUSTED,
                     tree=tmp_path)


def test_the_rebuild_set_leaves_out_what_the_run_never_imported() -> None:
    dists = {n: HONEST for n in ("torch", "nvidia-cublas-cu12", "numpy", "pydantic", "rich",
                                 "torch-manifest")}
    assert rebuild_set(dists, ["numpy"]) == ["numpy", "nvidia-cublas-cu12", "torch"]
    pins = pins_of(dists, tree=None, only=None)
    assert {p.name: p.kind for p in pins}["torch-manifest"] == "self"
    assert rebuild_set(dists, None) is None


def test_a_shared_prefix_is_not_torch_family() -> None:
    """torchvision, torchmetrics, tritonclient, nvidia-ml-py share a prefix with what counts
    unimported (torch, triton, the CUDA libraries): they count only when imported."""
    lookalikes = ("torchvision", "torchmetrics", "torchaudio", "tritonclient", "nvidia-ml-py",
                  "nvidia-dali-cuda120", "torch-manifest")
    family = ("torch", "triton", "pytorch-triton-rocm", "nvidia-cudnn-cu12", "nvidia-cublas",
              "nvidia-nccl-cu13", "cuda-toolkit")
    dists = {n: HONEST for n in (*lookalikes, *family, "numpy")}
    assert rebuild_set(dists, ["numpy"]) == sorted(("numpy", *family))
    # the control: imported, a lookalike counts like any package
    assert "torchvision" in (rebuild_set(dists, ["numpy", "torchvision"]) or [])


def test_uv_reads_an_option_line_in_a_requirements_file(tmp_path: Path) -> None:
    """Positive control for the option-name case: a requirements line that starts with '-'
    is an option to uv: a planted find-links folder serves what no index would."""
    from tests.pyenv_wheels import make_wheel

    uv = pytest.importorskip("uv").find_uv_bin()
    planted = tmp_path / "planted"
    make_wheel(planted, "alpha", "1.0", {"alpha/__init__.py": b"X = 666\n"})
    reqs = tmp_path / "reqs.txt"

    def compile_() -> subprocess.CompletedProcess[str]:
        return subprocess.run([uv, "pip", "compile", "--no-config", "--no-index", "--offline",
                               str(reqs)], capture_output=True, text=True, timeout=300,
                              check=False, cwd=tmp_path)

    reqs.write_text("alpha==1.0\n")
    assert compile_().returncode != 0
    reqs.write_text(f"--find-links={planted}\nalpha==1.0\n")
    done = compile_()
    assert done.returncode == 0 and "alpha==1.0" in done.stdout, done.stderr


def test_an_index_link_that_would_be_two_requirement_lines_is_not_served(
        tmp_path: Path) -> None:
    """An index page is data from the index: a link holding a newline (which would add an
    option line to uv's requirements file) serves nothing; the honest link serves."""
    from manifest.pyenv.archives import locate

    [pin] = pins_of({"alpha": HONEST}, tree=None)
    page = tmp_path / "simple" / "alpha"
    page.mkdir(parents=True)
    plan = plan_sources(None, index_urls=[(tmp_path / "simple").as_uri()], trust=UNTRUSTED,
                        tree=None)
    sha = "d" * 64
    honest = f'<a href="../../files/alpha-1.0-py3-none-any.whl#sha256={sha}">a</a>'
    (page / "index.html").write_text(honest)
    found = locate(pin, plan)
    assert found is not None and found.sha256 == sha  # positive control
    hostile = ('<a href="../../files/alpha-1.0-py3-none-any.whl&#10;--find-links /tmp/evil'
               f'&#10;x/alpha-1.0-py3-none-any.whl#sha256={sha}">a</a>')
    (page / "index.html").write_text(hostile)
    assert locate(pin, plan) is None


def test_a_recorded_archive_hash_is_required_of_the_file_found(tmp_path: Path) -> None:
    """A wheel the author installed from a file records its sha256: a file of the same name
    and version with other bytes does not serve it; the same bytes do."""
    import hashlib

    from manifest.pyenv.archives import locate
    from tests.pyenv_wheels import make_wheel

    wheel = make_wheel(tmp_path / "wheels", "alpha", "1.0", {"alpha/__init__.py": b"X = 1\n"})
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    plan = plan_sources(None, find_links=[tmp_path / "wheels"], trust=UNTRUSTED, tree=None)

    def pin_recording(digest: str) -> Any:
        record = dict(HONEST, direct_url={"url": "file:///author/alpha-1.0-py3-none-any.whl",
                                          "archive_hash": f"sha256={digest}"})
        return pins_of({"alpha": record}, tree=None)[0]

    found = locate(pin_recording(sha), plan)
    assert found is not None and found.sha256 == sha  # positive control
    assert locate(pin_recording("e" * 64), plan) is None
