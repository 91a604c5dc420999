"""Small real wheels, a real installed environment and a manifest that records it, for the
pyenv tests: no network, no build backend (a wheel is a zip with a RECORD)."""

from __future__ import annotations

import base64
import hashlib
import http.server
import shutil
import subprocess
import threading
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from manifest.canonical import dumps, load_manifest, seal, to_document
from manifest.models import Manifest

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"


def uv_bin() -> str:
    import uv

    found: str = uv.find_uv_bin()
    return found


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def make_wheel(folder: Path, name: str, version: str, files: Mapping[str, bytes], *,
               tag: str = "py3-none-any") -> Path:
    """A wheel of ``files`` (paths inside site-packages) with METADATA, WHEEL and RECORD."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\n"
                                   f"Version: {version}\n\n").encode()
    entries[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: "
                                f"true\nTag: {tag}\n\n").encode()
    lines = [f"{path},{_record_hash(data)},{len(data)}" for path, data in entries.items()]
    entries[f"{info}/RECORD"] = ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in entries.items():
            archive.writestr(member, data)
    return path


def standard_wheels(folder: Path) -> dict[str, Path]:
    """Two distributions, one with a local version label (``+cpu``, as torch's)."""
    return {
        "alpha": make_wheel(folder, "alpha", "1.0", {"alpha/__init__.py": b"X = 1\n",
                                                     "alpha/data.txt": b"weights\n"}),
        "beta-lib": make_wheel(folder, "beta-lib", "2.0+cpu",
                               {"beta_lib/__init__.py": b"Y = 2\n"}),
    }


def install(venv: Path, wheels: list[Path], *, by_path: bool = False) -> Path:
    """A venv with ``wheels`` installed by uv (offline), by name from their folder as an
    index install would be (no ``direct_url.json``), or ``by_path`` (a PEP 610 archive
    record with the file's URL and hash); its site-packages."""
    uv = uv_bin()
    subprocess.run([uv, "venv", "--quiet", "--no-config", str(venv)], check=True, timeout=300)
    if by_path:
        wanted = [str(w) for w in wheels]
    else:
        wanted = ["--find-links", str(wheels[0].parent)]
        wanted += [w.name.split("-")[0].replace("_", "-") for w in wheels]
    subprocess.run([uv, "pip", "install", "--quiet", "--no-config", "--no-index", "--no-deps",
                    "--python", str(venv / "bin" / "python"), *wanted],
                   check=True, timeout=300)
    return next(venv.glob("lib/python*/site-packages"))


def manifest_recording(site: Path, *, imported: list[str] | None = None,
                       sources: Mapping[str, Any] | None = None,
                       edit: Mapping[str, Any] | None = None) -> Manifest:
    """The golden manifest with its environment replaced by what the probe records of
    ``site`` (the other engineer's capture functions), sealed again."""
    from manifest.probes.distributions import environment_digest, probe_distributions

    dists = probe_distributions([str(site)])
    doc = to_document(load_manifest(GOLDEN.read_bytes()))
    env = dict(doc["env"])
    env["distributions"] = {k: v.model_dump(mode="json") for k, v in dists.items()}
    if edit:
        for name, fields in edit.items():
            env["distributions"][name] = dict(env["distributions"].get(name, {}), **fields)
    env["environment_digest"] = environment_digest(dists)
    env["imported"] = sorted(dists) if imported is None else imported
    env["sources"] = dict(sources) if sources is not None else None
    import sys

    env["python"] = ".".join(str(p) for p in sys.version_info[:3])
    doc["env"] = env
    return seal({k: v for k, v in doc.items() if k not in ("run_id", "digest")})


def write_manifest(manifest: Manifest, path: Path) -> Path:
    path.write_bytes(dumps(manifest))
    return path


def simple_index(root: Path, wheels: list[Path]) -> Path:
    """A PEP 503 index under ``root``: ``simple/<name>/index.html`` linking ``files/<wheel>``
    with its ``#sha256=``."""
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    by_name: dict[str, list[Path]] = {}
    for wheel in wheels:
        shutil.copy2(wheel, files / wheel.name)
        name = wheel.name.split("-")[0].replace("_", "-").lower()
        by_name.setdefault(name, []).append(wheel)
    for name, found in by_name.items():
        page = root / "simple" / name
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="../../files/{w.name.replace("+", "%2B")}#sha256='
            f'{hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n' for w in found)
        (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return root


@contextmanager
def serving(root: Path) -> Iterator[str]:
    """``root`` served over HTTP on 127.0.0.1 (a thread); yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)
