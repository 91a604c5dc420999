"""Each installed distribution by content: the record at capture, the proof on disk, the diff.

Real wheels (written with zipfile, the way a build backend lays one out) are
installed by real pip and uv into a temporary prefix, so RECORD, INSTALLER,
direct_url.json and the console script are the installers' own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest

from manifest.canonical import compute_run_id, load_manifest, seal, to_document
from manifest.diff.engine import diff_manifests
from manifest.models import Manifest
from manifest.probes.distributions import (
    NO_RECORD,
    _content_lines,
    default_cache_file,
    environment_digest,
    locate_distributions,
    probe_distributions,
    probe_sources,
    prove_distribution,
    read_direct_url,
    record_digest,
)
from manifest.probes.env import installed_distributions, probe_env

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"
PURELIB_REL = Path(sysconfig.get_path("purelib", vars={"base": "/p", "platbase": "/p"})
                   ).relative_to("/p")
TIMEOUT = 300
SECRET = "s3cr3t-Pa55word-xyz"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def write_wheel(folder: Path, name: str = "tinydist", version: str = "1.0",
                body: str = "VALUE = 1\n") -> Path:
    """A pure-Python wheel with a module, a data file and a console script."""
    files = {
        f"{name}/__init__.py": body.encode(),
        f"{name}/data.txt": b"payload\n",
        f"{name}/cli.py": b"def main() -> None:\n    print('hi')\n",
        f"{name}-{version}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n".encode(),
        f"{name}-{version}.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{name}-{version}.dist-info/entry_points.txt":
            f"[console_scripts]\n{name}-cli = {name}.cli:main\n".encode(),
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{name}-{version}.dist-info/RECORD,,\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return wheel


def _quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", UV_NO_CONFIG="1",
               UV_CACHE_DIR=str(Path(env.get("TMPDIR", "/tmp")) / "manifest-test-uv-cache"))
    return env


def pip_install(wheel: Path, prefix: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                    "--no-compile", "--prefix", str(prefix), str(wheel)],
                   check=True, capture_output=True, timeout=TIMEOUT, env=_quiet_env())
    return prefix / PURELIB_REL


def uv_install(wheel: Path, prefix: Path, link_mode: str = "copy") -> Path:
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    subprocess.run([uv, "pip", "install", "--no-deps", "--offline", "--python", sys.executable,
                    "--prefix", str(prefix), f"--link-mode={link_mode}", "--compile-bytecode",
                    str(wheel)], check=True, capture_output=True, timeout=TIMEOUT,
                   env=_quiet_env())
    return prefix / PURELIB_REL


def _dist_info(site: Path, name: str = "tinydist") -> Path:
    return next(site.glob(f"{name}-*.dist-info"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wheel(tmp_path_factory.mktemp("wheels"))


@pytest.fixture(scope="module")
def pip_prefix(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    prefix = tmp_path_factory.mktemp("pip-prefix")
    pip_install(wheel, prefix)
    return prefix


@pytest.fixture
def pip_site(pip_prefix: Path) -> Path:
    return pip_prefix / PURELIB_REL


@pytest.fixture
def own_site(pip_prefix: Path, tmp_path: Path) -> Path:
    """A copy of the pip install (prefix with bin/) that a test may edit."""
    shutil.copytree(pip_prefix, tmp_path / "prefix", symlinks=True)
    return tmp_path / "prefix" / PURELIB_REL


# ------------------------------------------------------------------ record


def test_pip_install_is_recorded_with_its_facts(pip_site: Path, wheel: Path) -> None:
    found = probe_distributions([str(pip_site)], use_cache=False)
    record = found["tinydist"]
    assert record.version == "1.0"
    assert record.tags == ["py3-none-any"]
    assert record.installer == "pip"
    assert record.files is not None and record.files.startswith("blake3:")
    # pip writes direct_url.json for a wheel given by path, with the archive's hash
    assert record.direct_url is not None
    assert record.direct_url.url == wheel.resolve().as_uri()
    assert record.direct_url.archive_hash == (
        "sha256=" + hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert environment_digest(found).startswith("blake3:")


def test_console_scripts_and_bookkeeping_are_left_out(pip_site: Path) -> None:
    dist_info = _dist_info(pip_site)
    record = (dist_info / "RECORD").read_text()
    # positive control: the installer did list them
    assert "../../../bin/tinydist-cli" in record
    assert "tinydist-1.0.dist-info/INSTALLER" in record
    kept = b"\n".join(_content_lines(dist_info, pip_site) or [])
    assert b"tinydist/__init__.py" in kept and b"tinydist/data.txt" in kept
    assert b"../../../bin" not in kept
    assert b"INSTALLER" not in kept and b"direct_url.json" not in kept
    assert b"dist-info/RECORD" not in kept and b".pyc" not in kept


def test_pip_and_uv_installs_of_one_wheel_give_one_digest(wheel: Path, pip_site: Path,
                                                          tmp_path: Path) -> None:
    uv_site = uv_install(wheel, tmp_path / "uv-prefix")
    uv_info = _dist_info(uv_site)
    assert (uv_info / "INSTALLER").read_text().strip() == "uv"
    # uv compiled bytecode and its RECORD differs from pip's: the digest does not
    assert (uv_info / "RECORD").read_bytes() != (_dist_info(pip_site) / "RECORD").read_bytes()
    assert record_digest(uv_info, uv_site) == record_digest(_dist_info(pip_site), pip_site)
    assert prove_distribution(uv_info, uv_site) == record_digest(uv_info, uv_site)
    linked = uv_install(wheel, tmp_path / "uv-hardlink", link_mode="hardlink")
    assert record_digest(_dist_info(linked), linked) == record_digest(uv_info, uv_site)


def test_another_build_of_the_same_version_has_other_files(tmp_path: Path,
                                                           pip_site: Path) -> None:
    other = write_wheel(tmp_path, body="VALUE = 2\n")
    site = pip_install(other, tmp_path / "prefix")
    assert record_digest(_dist_info(site), site) != record_digest(_dist_info(pip_site), pip_site)


def test_an_edited_installed_file_fails_the_proof_not_the_record(own_site: Path) -> None:
    site = own_site
    dist_info = _dist_info(site)
    recorded = record_digest(dist_info, site)
    # positive control: an honest install proves to exactly the recorded digest
    assert prove_distribution(dist_info, site) == recorded
    (site / "tinydist" / "__init__.py").write_text("VALUE = 666\n")
    assert record_digest(dist_info, site) == recorded
    assert prove_distribution(dist_info, site) != recorded
    (site / "tinydist" / "__init__.py").write_text("VALUE = 1\n")
    assert prove_distribution(dist_info, site) == recorded
    (site / "tinydist" / "data.txt").unlink()
    assert prove_distribution(dist_info, site) != recorded


def test_the_proof_ignores_a_console_script_and_bytecode(own_site: Path, tmp_path: Path) -> None:
    site = own_site
    dist_info = _dist_info(site)
    recorded = record_digest(dist_info, site)
    script = tmp_path / "prefix" / "bin" / "tinydist-cli"
    assert script.is_file()
    script.write_text("#!/elsewhere/python\n")
    cache = site / "tinydist" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "__init__.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert prove_distribution(dist_info, site) == recorded


def test_no_record_gives_none(tmp_path: Path) -> None:
    egg = tmp_path / "legacy-2.0.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: legacy\nVersion: 2.0\n\n")
    found = probe_distributions([str(tmp_path)], use_cache=False)
    assert found["legacy"].version == "2.0"
    assert found["legacy"].files is None and found["legacy"].tags == []
    bare = tmp_path / "bare-1.0.dist-info"
    bare.mkdir()
    assert record_digest(bare, tmp_path) is None
    assert prove_distribution(bare, tmp_path) is None


def test_probe_env_says_why_a_distribution_has_no_files(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    egg = tmp_path / "legacy-2.0.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: legacy\nVersion: 2.0\n\n")
    monkeypatch.setattr(sys, "path", [sys.path[0], str(tmp_path), *sys.path[1:]])
    env = probe_env()
    assert env.distributions is not None and env.distributions["legacy"].files is None
    assert env.unavailable["distributions[legacy].files"] == NO_RECORD
    # positive control: a distribution with a RECORD has files and no reason
    assert env.distributions["torch"].files is not None
    assert not any(key.startswith("distributions[torch]") for key in env.unavailable)


def test_the_cache_is_missed_when_record_is_rewritten(pip_site: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(pip_site, site)
    cache = tmp_path / "cache.json"
    first = probe_distributions([str(site)], cache_file=cache)["tinydist"]
    assert cache.is_file()
    assert probe_distributions([str(site)], cache_file=cache)["tinydist"] == first
    record = _dist_info(site) / "RECORD"
    record.write_text(record.read_text() + "tinydist/extra.py,sha256=AAAA,1\n")
    again = probe_distributions([str(site)], cache_file=cache)["tinydist"]
    assert again.files != first.files
    assert again == probe_distributions([str(site)], use_cache=False)["tinydist"]
    # each environment has its own file: another venv's capture does not evict this one's
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    mine = default_cache_file([str(site)], environ)
    assert mine != default_cache_file([str(pip_site)], environ)
    assert mine == default_cache_file([str(site)], environ)
    assert mine.parent == tmp_path / "xdg" / "manifest" / "distributions"


def test_records_cover_exactly_the_installed_distributions() -> None:
    found = probe_distributions(use_cache=False)
    assert {n: d.version for n, d in found.items()} == installed_distributions()
    assert found["torch"].files is not None and found["torch"].tags


def test_probe_env_records_distributions_sources_and_digest() -> None:
    env = probe_env()
    assert env.distributions is not None and env.distributions.keys() == env.packages.keys()
    assert env.environment_digest == environment_digest(env.distributions)
    assert env.sources is not None and env.sources.origin


# ------------------------------------------------------------- credentials


def test_direct_url_credentials_are_stripped(tmp_path: Path) -> None:
    dist_info = tmp_path / "x-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "direct_url.json").write_text(json.dumps({
        "url": f"https://user:{SECRET}@files.example.com/x-1.0.whl?token={SECRET}",
        "archive_info": {"hashes": {"sha256": "ab" * 32}}}))
    got = read_direct_url(dist_info)
    assert got is not None
    assert SECRET not in got.model_dump_json()
    assert got.url == "https://files.example.com/x-1.0.whl"  # positive control: host, path kept
    assert got.archive_hash == "sha256=" + "ab" * 32
    (dist_info / "direct_url.json").write_text(json.dumps({
        "url": "git+https://github.com/o/r.git",
        "vcs_info": {"vcs": "git", "commit_id": "c" * 40}}))
    vcs = read_direct_url(dist_info)
    assert vcs is not None and (vcs.vcs, vcs.commit_id) == ("git", "c" * 40)
    (dist_info / "direct_url.json").write_text(json.dumps({
        "url": "file:///src/proj", "dir_info": {"editable": True}}))
    editable = read_direct_url(dist_info)
    assert editable is not None and editable.editable


def test_sources_from_pip_and_uv_config_without_credentials(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    (etc / "xdg" / "pip").mkdir(parents=True)
    (etc / "xdg" / "pip" / "pip.conf").write_text(
        f"[global]\nindex-url = https://ci:{SECRET}@pypi.corp.example/simple\n"
        "extra-index-url =\n    https://download.pytorch.org/whl/cpu\n")
    home = tmp_path / "home"
    (home / ".config" / "uv").mkdir(parents=True)
    (home / ".config" / "uv" / "uv.toml").write_text(
        '[[index]]\nurl = "https://uv.example/simple"\n\n'
        '[[index]]\nurl = "https://flat.example/wheels/"\nformat = "flat"\n')
    environ = {"HOME": str(home), "PIP_FIND_LINKS": f"https://u:{SECRET}@links.example/w",
               "UV_EXTRA_INDEX_URL": "https://extra.example/simple?token=" + SECRET}
    got = probe_sources(environ, cwd=tmp_path, etc=etc)
    assert SECRET not in got.model_dump_json()
    # positive control: every configured place is there, host and path kept
    assert got.indexes == ["https://pypi.corp.example/simple",
                           "https://download.pytorch.org/whl/cpu",
                           "https://uv.example/simple", "https://extra.example/simple"]
    assert got.find_links == ["https://flat.example/wheels/", "https://links.example/w"]
    assert "pip.conf" in got.origin and "uv.toml" in got.origin
    assert "PIP_FIND_LINKS" in got.origin and "UV_EXTRA_INDEX_URL" in got.origin


def test_sources_with_nothing_configured_say_so(tmp_path: Path) -> None:
    got = probe_sources({"HOME": str(tmp_path)}, cwd=tmp_path, etc=tmp_path / "etc")
    assert got.indexes == ["https://pypi.org/simple"] and got.find_links == []
    assert got.origin.startswith("nothing configured")
    disabled = probe_sources({"HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull},
                             cwd=tmp_path, etc=Path("/etc"))
    assert "pip config" not in disabled.origin
    offline = probe_sources({"HOME": str(tmp_path), "PIP_NO_INDEX": "1",
                             "PIP_FIND_LINKS": "/srv/wheels"}, cwd=tmp_path, etc=tmp_path)
    assert offline.indexes == [] and offline.find_links == ["/srv/wheels"]
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[tool.uv]\nindex-url = "https://proj.example/simple"\n')
    found = probe_sources({"HOME": str(tmp_path)}, cwd=project / "sub", etc=tmp_path)
    assert found.indexes == ["https://proj.example/simple"]
    assert f"uv config {project / 'pyproject.toml'}" in found.origin


# ------------------------------------------------------------ identity, diff


def _golden() -> Manifest:
    return load_manifest(GOLDEN.read_bytes())


def _with_env(base: Manifest, **env: Any) -> Manifest:
    doc = to_document(base)
    doc["env"] = {**doc["env"], **env}
    return seal(doc)


def _records(**overrides: Any) -> dict[str, Any]:
    records: dict[str, dict[str, Any]] = {
        "numpy": {"version": "2.3.5", "tags": ["cp311-cp311-manylinux_2_28_x86_64"],
                  "installer": "pip", "direct_url": None, "files": "blake3:" + "1" * 64},
        "tqdm": {"version": "4.70.1", "tags": ["py3-none-any"], "installer": "pip",
                 "direct_url": None, "files": "blake3:" + "2" * 64},
        "proj": {"version": "0.1", "tags": ["py3-none-any"], "installer": "pip",
                 "direct_url": {"url": "file:///home/a/proj", "editable": True},
                 "files": "blake3:" + "3" * 64},
    }
    for name, changes in overrides.items():
        records[name] = {**records[name], **changes}
    return records


def _run(**overrides: Any) -> Manifest:
    packages = {"numpy": "2.3.5", "tqdm": "4.70.1", "proj": "0.1"}
    return _with_env(_golden(), packages=packages, imported=["numpy", "proj"],
                     distributions=_records(**overrides))


def test_old_manifests_load_and_keep_their_run_id() -> None:
    golden = _golden()
    assert golden.env.distributions is None and golden.env.sources is None
    assert compute_run_id(to_document(golden)) == golden.run_id


def test_run_id_counts_files_where_the_version_counts() -> None:
    base = _run()
    # positive control: another build of an imported distribution renames the run
    assert _run(numpy={"files": "blake3:" + "9" * 64}).run_id != base.run_id
    assert _run(tqdm={"files": "blake3:" + "9" * 64}).run_id == base.run_id  # not imported
    assert _run(numpy={"installer": "uv"}).run_id == base.run_id
    assert _run(proj={"files": "blake3:" + "9" * 64,
                      "direct_url": {"url": "file:///home/b/proj", "editable": True}}
                ).run_id == base.run_id  # an editable install's files name the checkout
    sourced = _with_env(base, sources={"indexes": ["https://x.example/simple"],
                                       "find_links": [], "origin": "PIP_INDEX_URL"},
                        environment_digest="blake3:" + "7" * 64)
    assert sourced.run_id == base.run_id


def test_diff_names_another_build_of_the_same_version() -> None:
    result = diff_manifests(_run(), _run(numpy={"files": "blake3:" + "9" * 64}))
    bits = [d.reason for d in result.differences if d.impact == "bits"]
    assert bits == ["numpy 2.3.5: same version, other files (another build)"]
    not_imported = diff_manifests(_run(), _run(tqdm={"files": "blake3:" + "9" * 64}))
    assert not [d for d in not_imported.differences if d.impact == "bits"]
    assert any("tqdm 4.70.1: same version, other files" in d.reason
               for d in not_imported.differences)
    installer = diff_manifests(_run(), _run(numpy={"installer": "uv"}))
    assert [(d.impact, d.path) for d in installer.differences] == [
        ("benign", "env.distributions[numpy].installer")]


def test_an_environment_installed_by_another_installer_is_one_benign_line() -> None:
    def run(installer: str) -> Manifest:
        records = {f"lib{n}": {"version": "1.0", "tags": ["py3-none-any"],
                               "installer": installer, "direct_url": None,
                               "files": "blake3:" + f"{n}" * 64} for n in range(5)}
        return _with_env(_golden(), packages={name: "1.0" for name in records},
                         imported=list(records), distributions=records)

    result = diff_manifests(run("pip"), run("uv"))
    assert [(d.impact, d.reason) for d in result.differences] == [
        ("benign", "installer pip → uv in 5 distributions (lib0, lib1, lib2 …): how it was "
                   "installed, not what it holds: its files are compared on their own line")]
    # positive control: a few stay one line each, named
    few = diff_manifests(_run(), _run(numpy={"installer": "uv"}, tqdm={"installer": "uv"}))
    assert [d.path for d in few.differences] == ["env.distributions[numpy].installer",
                                                 "env.distributions[tqdm].installer"]


def test_a_version_change_is_one_line() -> None:
    a = _run()
    doc = to_document(a)
    doc["env"]["packages"]["numpy"] = "2.4.6"
    doc["env"]["distributions"]["numpy"] = {**doc["env"]["distributions"]["numpy"],
                                            "version": "2.4.6", "files": "blake3:" + "8" * 64}
    result = diff_manifests(a, seal(doc))
    assert [d.path for d in result.differences] == ["env.packages[numpy]"]


def test_cuda_12_to_13_renames_are_one_line_each() -> None:
    base = _golden()
    cu12 = {"torch": "2.9.0", "nvidia-cublas-cu12": "12.8.4.1",
            "nvidia-cudnn-cu12": "9.10.2.21"}
    cu13 = {"torch": "2.9.0", "nvidia-cublas": "13.0.0.19", "nvidia-cudnn-cu13": "9.13.0.50",
            "cuda-toolkit": "13.0.1"}
    result = diff_manifests(_with_env(base, packages=cu12), _with_env(base, packages=cu13))
    lines = {d.path: d for d in result.differences if d.path.startswith("env.packages[")}
    assert set(lines) == {"env.packages[nvidia-cublas-cu12 → nvidia-cublas]",
                          "env.packages[nvidia-cudnn-cu12 → nvidia-cudnn-cu13]",
                          "env.packages[cuda-toolkit]"}
    cublas = lines["env.packages[nvidia-cublas-cu12 → nvidia-cublas]"]
    assert cublas.impact == "bits"
    assert cublas.reason.startswith(
        "package nvidia-cublas-cu12 12.8.4.1 → nvidia-cublas 13.0.0.19: renamed with CUDA 12 → ")
    assert "metapackage" in lines["env.packages[cuda-toolkit]"].reason
    # positive control: an unrelated removal and addition stay two lines
    other = diff_manifests(_with_env(base, packages={"nvidia-cublas-cu12": "12.8.4.1"}),
                           _with_env(base, packages={"nvidia-cusparse": "13.0.0"}))
    assert {d.path for d in other.differences if d.path.startswith("env.packages[")} == {
        "env.packages[nvidia-cublas-cu12]", "env.packages[nvidia-cusparse]"}


def test_locate_gives_what_prove_needs(pip_site: Path) -> None:
    version, dist_info, site = locate_distributions([str(pip_site)])["tinydist"]
    assert version == "1.0" and site == pip_site
    assert prove_distribution(dist_info, site) == record_digest(dist_info, site)


def test_a_pip_conf_naming_no_source_is_not_parsed(tmp_path: Path) -> None:
    """A pip.conf with a certificate only changes nothing (and costs no configparser); a
    broken one that names an index is said unreadable (the control: it was parsed)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca.crt\n")
    quiet = probe_sources({"HOME": str(tmp_path)}, cwd=tmp_path, etc=etc)
    assert "pip config" not in quiet.origin and quiet.indexes == ["https://pypi.org/simple"]
    (etc / "pip.conf").write_text("[global\nindex-url = https://corp.example/simple\n")
    broken = probe_sources({"HOME": str(tmp_path)}, cwd=tmp_path, etc=etc)
    assert "(unreadable)" in broken.origin
    (etc / "pip.conf").write_text("[global]\nINDEX-URL = https://corp.example/simple\n")
    named = probe_sources({"HOME": str(tmp_path)}, cwd=tmp_path, etc=etc)
    assert named.indexes == ["https://corp.example/simple"]
