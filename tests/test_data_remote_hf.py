"""Hub datasets against a local server answering the Hub's HTTP API (never the network)."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from manifest.data.remote import pin_dataset, recheck
from manifest.data.remote.pins import parse_pins
from manifest.errors import DataError
from manifest.store import BlobStore

COMMIT = "a" * 40
NEXT = "b" * 40
LFS_BYTES = b"\x00\x01" * 1000
TREE = [
    {"type": "directory", "oid": "d" * 40, "size": 0, "path": "train"},
    {"type": "file", "oid": "1" * 40, "size": 12, "path": "README.md"},
    {"type": "file", "oid": "2" * 40, "size": len(LFS_BYTES), "path": "train/0.parquet",
     "lfs": {"oid": hashlib.sha256(LFS_BYTES).hexdigest(), "size": len(LFS_BYTES),
             "pointerSize": 134}},
]


class _Hub(http.server.BaseHTTPRequestHandler):
    requests: list[str] = []  # noqa: RUF012 (one server per test module)
    refs: dict[str, str] = {"main": COMMIT, "v1": COMMIT}  # noqa: RUF012 (branches, tags)

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        _Hub.requests.append(self.path)
        path = self.path.split("?")[0]
        shas = {**_Hub.refs, COMMIT: COMMIT, NEXT: NEXT}
        rev = path.removeprefix("/api/datasets/org/set/revision/")
        if path.startswith("/api/datasets/org/set/revision/") and rev in shas:
            self._json({"id": "org/set", "sha": shas[rev], "private": False})
        elif path.startswith("/api/datasets/org/set/revision/"):
            self.send_response(404)
            self.send_header("X-Error-Code", "RevisionNotFound")
            self.send_header("X-Error-Message", "Invalid rev id")
            self.end_headers()
        elif path.startswith(f"/api/datasets/org/set/tree/{COMMIT}"):
            self._json(TREE)
        elif path.startswith("/api/datasets/"):
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def store(tmp_path: Path, hub: str, monkeypatch: pytest.MonkeyPatch) -> BlobStore:
    monkeypatch.setenv("HF_ENDPOINT", hub)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(_Hub, "refs", {"main": COMMIT, "v1": COMMIT})
    blobs = BlobStore(tmp_path / "store")
    blobs.ensure()
    return blobs


def test_hub_pins_are_content_digests_at_a_commit(store: BlobStore, hub: str) -> None:
    _Hub.requests.clear()
    ds = pin_dataset("set", "hf://datasets/org/set@main", store=store)
    assert ds.path == "hf://datasets/org/set@main"
    assert ds.remote is not None
    assert ds.remote.revision == COMMIT
    assert ds.remote.strength == "content-digest"
    assert ds.remote.checksums == {"git-sha1": 1, "sha256": 1}
    assert ds.remote.versioned == 2
    assert ds.remote.endpoint == hub
    blob = store.get(ds.remote.pins)
    assert blob is not None
    pins = parse_pins(blob)
    assert list(pins) == ["README.md", "train/0.parquet"]
    assert pins["train/0.parquet"].checksum == hashlib.sha256(LFS_BYTES).hexdigest()
    assert not any("/resolve/" in path for path in _Hub.requests)  # no file body read
    assert recheck(ds, store) == []


def test_hub_subfolder_and_errors(store: BlobStore) -> None:
    ds = pin_dataset("t", "hf://datasets/org/set@main/train", store=store)
    assert ds.files == 1
    with pytest.raises(DataError, match="no such dataset, or no access to it"):
        pin_dataset("x", "hf://datasets/org/missing", store=store)
    with pytest.raises(DataError, match="revision nope does not exist"):
        pin_dataset("x", "hf://datasets/org/set@nope", store=store)


def test_recheck_names_a_branch_or_tag_that_moved(store: BlobStore) -> None:
    on_main = pin_dataset("set", "hf://datasets/org/set@main", store=store)
    on_tag = pin_dataset("set", "hf://datasets/org/set@v1", store=store)
    on_commit = pin_dataset("set", f"hf://datasets/org/set@{COMMIT}", store=store)
    assert on_main.root == on_tag.root == on_commit.root  # the pins hold the commit
    _Hub.refs["main"] = NEXT
    # The pinned commit is listed unchanged; the branch the URL names is not where it was.
    assert recheck(on_main, store) == [
        f"revision main now points at {NEXT}, the run used {COMMIT}."]
    assert recheck(on_tag, store) == []
    assert recheck(on_commit, store) == []  # a commit cannot move
    del _Hub.refs["v1"]
    assert recheck(on_tag, store) == [f"revision v1 no longer exists, the run used {COMMIT}."]
