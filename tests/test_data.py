"""Dataset digests: the Merkle construction, its golden bytes, and hostile trees.

Every tree is built in ``tmp_path``. The pool tests force the fork pool on
small trees by lowering ``IN_PROCESS_MAX`` (and ``BIG_FILE`` for the mmap
path), so both ways of hashing are held to the same roots.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from manifest.data import cache as datacache
from manifest.data import digest as datadigest
from manifest.data import pool as datapool
from manifest.data import reading as datareading
from manifest.data import walk as datawalk
from manifest.data import workers as dataworkers
from manifest.data.digest import DatasetDigest, digest_path
from manifest.data.listing import (
    LISTING_HEADER,
    TREE_CONTEXT,
    listing_root,
    parse_listing,
    path_bytes,
    path_text,
)
from manifest.errors import DataError
from manifest.store import BlobStore

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def digest(path: Path, **kwargs: object) -> DatasetDigest:
    return digest_path(path, cache=None, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=["in-process", "pool", "trees"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test hashing in this process, through the fork pool by chunks, and with
    every directory below the top walked and hashed by a worker as a subtree."""
    if request.param == "pool":
        monkeypatch.setattr(datapool, "IN_PROCESS_MAX", 0)
        monkeypatch.setattr(datapool, "CHUNK_ENTRIES", 2)
    if request.param == "trees":
        monkeypatch.setattr(datawalk, "TREES_PER_JOB", 0)
        monkeypatch.setattr(datawalk, "EXPAND_LEVELS", 1)
    return str(request.param)


def build_golden(root: Path) -> Path:
    """The fixed tree whose root is pinned below."""
    root.mkdir()
    (root / "a.txt").write_bytes(b"hello\n")
    (root / "dir").mkdir()
    (root / "dir" / "b.bin").write_bytes(bytes(range(256)) * 4)
    (root / "dir" / "empty").mkdir()
    (root / "dir" / "link").symlink_to("../a.txt")
    (root / "dir-x").mkdir()
    (root / "zero").write_bytes(b"")
    return root


GOLDEN_LISTING = (
    "manifest-tree/v1\n"
    "f\t6\t" + blake3.blake3(b"hello\n").hexdigest() + "\ta.txt\n"
    "d\tdir\n"
    "d\tdir-x\n"
    "f\t1024\t" + blake3.blake3(bytes(range(256)) * 4).hexdigest() + "\tdir/b.bin\n"
    "d\tdir/empty\n"
    "l\t../a.txt\tdir/link\n"
    "f\t0\t" + blake3.blake3(b"").hexdigest() + "\tzero\n"
).encode()
GOLDEN_ROOT = "blake3:196640712f773e213657984481f15be65af0cdff2989bbf728641237ef7a5730"
"""Pinned: a change here is a change of the construction, and of every recorded run_id."""


# ------------------------------------------------------------------ golden


def test_golden_listing_bytes(tmp_path: Path, mode: str) -> None:
    found = digest(build_golden(tmp_path / "t"))
    # Sorted by path bytes: "dir" < "dir-x" < "dir/b.bin" because "-" (0x2d) < "/" (0x2f).
    assert found.listing == GOLDEN_LISTING
    assert (found.files, found.total_bytes, found.is_dir) == (3, 1030, True)


def test_golden_root(tmp_path: Path, mode: str) -> None:
    found = digest(build_golden(tmp_path / "t"))
    expected = "blake3:" + blake3.blake3(GOLDEN_LISTING,
                                         derive_key_context=TREE_CONTEXT).hexdigest()
    assert found.root == expected
    assert found.root == GOLDEN_ROOT
    assert listing_root(found.listing) == found.root


def test_tree_root_matches_b3sum_derive_key(tmp_path: Path) -> None:
    if shutil.which("b3sum") is None:
        pytest.skip("b3sum is not installed")
    found = digest(build_golden(tmp_path / "t"))
    listing = tmp_path / "listing"
    listing.write_bytes(found.listing)
    out = subprocess.run(["b3sum", "--no-names", "--derive-key", TREE_CONTEXT, str(listing)],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert found.root == "blake3:" + out


def test_file_root_is_plain_blake3(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 5000)
    found = digest(path)
    assert found.root == "blake3:" + blake3.blake3(b"x" * 5000).hexdigest()
    assert (found.files, found.total_bytes, found.is_dir) == (1, 5000, False)
    assert found.listing == f"{LISTING_HEADER}\nf\t5000\t{found.root[7:]}\t\n".encode()
    assert listing_root(found.listing) == found.root
    if shutil.which("b3sum"):
        out = subprocess.run(["b3sum", "--no-names", str(path)], capture_output=True,
                             text=True, check=True).stdout.strip()
        assert found.root == "blake3:" + out


def test_big_files_through_mmap_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    blobs = {f"f{i}": os.urandom(3000 + i * 1000) for i in range(6)}
    for name, blob in blobs.items():
        (tree / name).write_bytes(blob)
    expected = digest(tree)
    monkeypatch.setattr(datareading, "BIG_FILE", 2048)
    monkeypatch.setattr(datareading, "SLICE", 1000)
    assert digest(tree) == expected
    assert digest(tree / "f5").root == "blake3:" + blake3.blake3(blobs["f5"]).hexdigest()


# -------------------------------------------------------------- stability


def _make(root: Path, files: dict[str, bytes], order: list[str]) -> None:
    root.mkdir()
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])


names = st.lists(
    st.text(alphabet="ab-_./", min_size=1, max_size=6).filter(
        lambda s: all(part not in ("", ".", "..") for part in s.split("/"))),
    min_size=1, max_size=8, unique=True,
)


@settings(max_examples=30, deadline=None)
@given(names=names, data=st.data())
def test_root_independent_of_creation_order(tmp_path_factory: pytest.TempPathFactory,
                                            names: list[str], data: st.DataObject) -> None:
    # A name that is both a file and a directory prefix cannot exist; drop those.
    files = {n: n.encode() * 3 for n in names
             if not any(o.startswith(n + "/") for o in names)}
    order = data.draw(st.permutations(sorted(files)))
    one, two = tmp_path_factory.mktemp("one") / "t", tmp_path_factory.mktemp("two") / "t"
    _make(one, files, sorted(files))
    _make(two, files, list(order))
    assert digest(one).root == digest(two).root


def test_pool_and_in_process_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    for i in range(40):
        (tree / f"d{i % 7}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 7}" / f"f{i}").write_bytes(os.urandom(i * 13))
    expected = digest(tree)
    monkeypatch.setattr(datapool, "IN_PROCESS_MAX", 0)
    for chunk in (1, 3, 512):
        monkeypatch.setattr(datapool, "CHUNK_ENTRIES", chunk)
        assert digest(tree) == expected


@pytest.mark.parametrize("change", ["byte", "rename", "link", "empty-dir", "add", "remove"])
def test_root_changes_with_bytes_names_and_links(tmp_path: Path, change: str) -> None:
    tree = build_golden(tmp_path / "t")
    before = digest(tree).root
    if change == "byte":
        (tree / "dir" / "b.bin").write_bytes(b"\x01" + (bytes(range(256)) * 4)[1:])
    elif change == "rename":
        (tree / "a.txt").rename(tree / "A.txt")
        (tree / "dir" / "link").unlink()
        (tree / "dir" / "link").symlink_to("../A.txt")
    elif change == "link":
        (tree / "dir" / "link").unlink()
        (tree / "dir" / "link").symlink_to("../zero")
    elif change == "empty-dir":
        (tree / "dir" / "empty" / "inner").mkdir()
    elif change == "add":
        (tree / "new").write_bytes(b"")
    else:
        (tree / "zero").unlink()
    assert digest(tree).root != before


def test_permissions_and_times_are_not_part_of_the_root(tmp_path: Path) -> None:
    tree = build_golden(tmp_path / "t")
    before = digest(tree).root
    (tree / "a.txt").chmod(0o755)
    os.utime(tree / "zero", (1, 1))
    assert digest(tree).root == before


# ------------------------------------------------------------ path text


def test_path_text_examples() -> None:
    assert path_text(b"plain/name.txt") == "plain/name.txt"
    assert path_text("café".encode()) == "café"
    assert path_text(b"caf\xe9") == "caf\\xe9"
    assert path_text(b"back\\slash") == "back\\\\slash"
    assert path_text(b"tab\there\nnl") == "tab\\x09here\\x0anl"
    assert path_text(b"\xed\xa0\x80") == "\\xed\\xa0\\x80"  # an encoded surrogate is not UTF-8


@given(st.binary(max_size=40))
def test_path_text_is_lossless_utf8(name: bytes) -> None:
    text = path_text(name)
    text.encode("utf-8")  # never a lone surrogate
    assert path_bytes(text) == name
    assert not any(ord(c) < 0x20 or c == "\x7f" for c in text)


def test_non_utf8_names_survive(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    try:
        (tree / os.fsdecode(b"caf\xe9.txt")).write_bytes(b"1")
    except (OSError, UnicodeEncodeError):
        pytest.skip("this filesystem refuses non-UTF-8 names")
    (tree / "caf\u00e9.txt").write_bytes(b"2")
    found = digest(tree)
    entries = parse_listing(found.listing)
    assert set(entries) == {b"caf\xe9.txt", "café.txt".encode()}
    found.listing.decode("utf-8")
    assert b"caf\\xe9.txt" in found.listing


# ---------------------------------------------------------- hostile trees


def test_symlinks_are_recorded_never_followed(tmp_path: Path, mode: str) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"secret")
    (tree / "loop-a").symlink_to("loop-b")
    (tree / "loop-b").symlink_to("loop-a")
    (tree / "self").symlink_to("self")
    (tree / "escape").symlink_to(tmp_path / "outside.bin")
    (tree / "dangling").symlink_to("nowhere")
    (tree / "up").symlink_to("..")
    found = digest(tree)
    entries = parse_listing(found.listing)
    assert entries[b"escape"] == ("l", [path_text(os.fsencode(tmp_path / "outside.bin"))])
    assert entries[b"dangling"] == ("l", ["nowhere"])
    assert entries[b"loop-a"] == ("l", ["loop-b"])
    assert entries[b"up"] == ("l", [".."])
    assert found.files == 0
    before = found.root
    (tmp_path / "outside.bin").write_bytes(b"changed")
    assert digest(tree).root == before  # the target is not hashed


def test_fifo_socket_and_devices_are_never_opened(tmp_path: Path, mode: str) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    os.mkfifo(tree / "fifo")  # opening it for reading would block forever
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tree / "sock"))
    except OSError:
        pytest.skip("cannot bind a unix socket here")
    finally:
        sock.close()
    if IS_ROOT:
        os.mknod(tree / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    entries = parse_listing(digest(tree).listing)
    assert entries[b"fifo"] == ("p", [])
    assert entries[b"sock"] == ("s", [])
    if IS_ROOT:
        assert entries[b"null"] == ("c", [])


def test_top_level_device_or_fifo_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="character device"):
        digest(Path("/dev/null"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(DataError, match="FIFO, not a file or directory"):
        digest(tmp_path / "fifo")


def test_missing_dangling_and_looping_top_level(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        digest(tmp_path / "nope")
    (tmp_path / "dangle").symlink_to("nowhere")
    with pytest.raises(DataError, match="symbolic link to nowhere, which does not exist"):
        digest(tmp_path / "dangle")
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(DataError, match="symbolic link loop"):
        digest(tmp_path / "loop")


def test_top_level_link_is_followed(tmp_path: Path) -> None:
    tree = build_golden(tmp_path / "t")
    (tmp_path / "alias").symlink_to("t")
    (tmp_path / "file-alias").symlink_to("t/a.txt")
    assert digest(tmp_path / "alias").root == digest(tree).root
    assert digest(tmp_path / "file-alias").root == digest(tree / "a.txt").root


def test_empty_tree_empty_file_and_zero_bytes(tmp_path: Path, mode: str) -> None:
    (tmp_path / "empty").mkdir()
    empty = digest(tmp_path / "empty")
    assert empty.listing == b"manifest-tree/v1\n"
    assert (empty.files, empty.total_bytes) == (0, 0)
    assert empty.root == "blake3:" + blake3.blake3(
        b"manifest-tree/v1\n", derive_key_context=TREE_CONTEXT).hexdigest()
    (tmp_path / "e.bin").write_bytes(b"")
    assert digest(tmp_path / "e.bin").root == "blake3:" + blake3.blake3(b"").hexdigest()
    (tmp_path / "zeros").mkdir()
    (tmp_path / "zeros" / "a").write_bytes(b"")
    (tmp_path / "zeros" / "b").write_bytes(b"")
    zero = digest(tmp_path / "zeros")
    assert (zero.files, zero.total_bytes) == (2, 0)
    assert zero.root not in (empty.root,)


def test_hard_links_are_listed_per_path(tmp_path: Path, mode: str) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "a").write_bytes(b"same bytes")
    os.link(tree / "a", tree / "b")
    found = digest(tree)
    entries = parse_listing(found.listing)
    assert entries[b"a"] == entries[b"b"]
    assert (found.files, found.total_bytes) == (2, 20)


def _as_unprivileged(fn: Callable[[], str]) -> str:
    """Run ``fn`` as-is, or as root in a forked child that became ``nobody`` first."""
    if not IS_ROOT:
        return fn()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write_fd, fn().encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        out = fh.read().decode()
    os.waitpid(pid, 0)
    return out


def test_unreadable_file_and_directory_real_permissions(mode: str) -> None:
    # Under /tmp directly: pytest's own tmp dir is private to the user running it.
    base = Path(tempfile.mkdtemp(prefix="manifest-perm-"))
    try:
        base.chmod(0o755)
        tree = base / "t"
        (tree / "locked").mkdir(parents=True)
        (tree / "secret.bin").write_bytes(b"x")
        (tree / "ok").write_bytes(b"y")
        if IS_ROOT:
            for p in (tree, tree / "locked", tree / "secret.bin", tree / "ok"):
                os.chown(p, 65534, 65534)
        (tree / "secret.bin").chmod(0)
        (tree / "locked").chmod(0)

        def attempt() -> str:
            try:
                digest(tree)
            except DataError as exc:
                return str(exc)
            return "no error"

        message = _as_unprivileged(attempt)
    finally:
        (base / "t" / "locked").chmod(0o755)
        shutil.rmtree(base)
    assert "cannot read 2 entries" in message
    assert "secret.bin (permission denied)" in message
    assert "locked (permission denied)" in message


def test_unreadable_file_works_as_root_too(tmp_path: Path, mode: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "secret.bin").write_bytes(b"x")
    (tree / "ok").write_bytes(b"y")
    real_open = os.open

    def deny(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if os.fsencode(path).endswith(b"secret.bin"):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(DataError) as err:
        digest(tree)
    assert str(err.value) == "cannot read 1 entry of dataset " + path_text(
        os.fsencode(tree)) + ": secret.bin (permission denied)."
    assert err.value.hint is not None


def test_file_deleted_between_listing_and_opening(tmp_path: Path, mode: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "gone.bin").write_bytes(b"x")
    (tree / "stays").write_bytes(b"y")
    real = datapool.hash_entries

    def delete_then_hash(*args: object, **kwargs: object) -> datapool.Hashed:
        (tree / "gone.bin").unlink()
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("manifest.data.digest.hash_entries", delete_then_hash)
    with pytest.raises(DataError, match=r"gone\.bin was removed while the dataset"):
        digest(tree)


def _growing_reads(monkeypatch: pytest.MonkeyPatch, target: Path, times: int) -> None:
    """Make each of the first ``times`` reads of ``target`` append to it first."""
    real_read = os.read
    count = {"n": 0}

    def read(fd: int, n: int) -> bytes:
        if count["n"] < times and os.path.samestat(os.fstat(fd), os.stat(target)):
            count["n"] += 1
            with open(target, "ab") as fh:
                fh.write(b"+")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)


def test_file_modified_while_hashed_is_retried(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    target = tree / "busy.log"
    target.write_bytes(b"start")
    _growing_reads(monkeypatch, target, times=1)
    found = digest(tree)
    assert parse_listing(found.listing)[b"busy.log"][1][1] == blake3.blake3(
        b"start+").hexdigest()


def test_file_that_keeps_changing_is_reported(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    target = tree / "busy.log"
    target.write_bytes(b"start")
    _growing_reads(monkeypatch, target, times=100)
    with pytest.raises(DataError, match=r"busy\.log kept changing while it was being hashed"):
        digest(tree)
    with pytest.raises(DataError, match="kept changing"):
        digest(target)


def test_a_worker_killed_by_sigbus_is_recovered(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    for i in range(4):
        (tree / f"f{i}").write_bytes(os.urandom(5000))
    expected = digest(tree)
    monkeypatch.setattr(datareading, "BIG_FILE", 4096)
    monkeypatch.setattr(datapool, "IN_PROCESS_MAX", 0)

    def die(*args: object) -> datareading.FileResult:
        os.kill(os.getpid(), signal.SIGBUS)  # what touching a truncated mapping does
        raise AssertionError("unreachable")

    monkeypatch.setattr(dataworkers, "hash_mapped", die)
    assert digest(tree) == expected


def test_bind_mount_style_loop_is_refused(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    (tree / "a" / "b").mkdir(parents=True)
    real_stat = os.DirEntry.stat if hasattr(os, "DirEntry") else None
    assert real_stat is not None
    top = os.stat(tree)

    class LoopEntry:
        """A DirEntry whose directory claims to be the dataset root (as a bind mount would)."""

        def __init__(self, entry: os.DirEntry[bytes]) -> None:
            self._entry = entry
            self.name, self.path = entry.name, entry.path

        def is_symlink(self) -> bool:
            return self._entry.is_symlink()

        def is_dir(self, follow_symlinks: bool = True) -> bool:
            return self._entry.is_dir(follow_symlinks=follow_symlinks)

        def is_file(self, follow_symlinks: bool = True) -> bool:
            return self._entry.is_file(follow_symlinks=follow_symlinks)

        def stat(self, follow_symlinks: bool = True) -> os.stat_result:
            return top if self.name == b"b" else self._entry.stat(follow_symlinks=follow_symlinks)

    real_scandir = os.scandir

    class Scan:
        def __init__(self, path: bytes) -> None:
            self._it = real_scandir(path)

        def __enter__(self) -> Iterator[LoopEntry]:
            return (LoopEntry(e) for e in self._it)

        def __exit__(self, *exc: object) -> None:
            self._it.close()

    monkeypatch.setattr("manifest.data.walk.os.scandir", Scan)
    with pytest.raises(DataError, match="a/b is a directory already seen above it"):
        digest(tree)


def test_store_inside_dataset_is_skipped(tmp_path: Path) -> None:
    tree = build_golden(tmp_path / "t")
    before = digest(tree).root
    (tree / ".manifest").mkdir()
    (tree / ".manifest" / "x").write_bytes(b"cache")
    assert digest(tree, skip=[tree / ".manifest"]).root == before
    assert digest(tree).root != before


# ------------------------------------------------------------------- cache


@pytest.fixture
def no_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test just now may be cached (their ctime cannot be aged)."""
    monkeypatch.setattr(datacache, "RACY_WINDOW_NS", 0)


def _count_opens(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    opened: list[bytes] = []
    real_open = os.open

    def counting(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if not flags & os.O_DIRECTORY:
            opened.append(os.fsencode(path))  # type: ignore[arg-type]
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting)
    return opened


@pytest.mark.usefixtures("no_racy_window")
def test_warm_rehash_opens_no_file(tmp_path: Path, mode: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tree = build_golden(tmp_path / "t")
    cache = datacache.DigestCache(tmp_path / "store" / datacache.CACHE_FILENAME)
    cold = digest_path(tree, cache=cache)
    opened = _count_opens(monkeypatch)
    warm = digest_path(tree, cache=cache)
    assert warm == cold
    if mode == "in-process":
        assert opened == []
        again = digest_path(tree, cache=cache, no_cache=True)
        assert again == cold
        assert len(opened) == 3


def test_racily_clean_files_are_not_cached(tmp_path: Path) -> None:
    tree = build_golden(tmp_path / "t")
    cache = datacache.DigestCache(tmp_path / "store" / datacache.CACHE_FILENAME)
    digest_path(tree, cache=cache)
    # Written a moment ago: within the racy window, so nothing was kept.
    assert not cache.path.exists() or cache.lookup(
        [datacache.StatKey.of(os.stat(tree / "a.txt"))]) == [None]
    cache.close()


@pytest.mark.usefixtures("no_racy_window")
def test_same_size_rewrite_with_forged_mtime_misses(tmp_path: Path) -> None:
    tree = tmp_path / "t"
    tree.mkdir()
    target = tree / "data.bin"
    target.write_bytes(b"AAAA")
    st0 = os.stat(target)
    cache = datacache.DigestCache(tmp_path / datacache.CACHE_FILENAME)
    before = digest_path(tree, cache=cache)
    target.write_bytes(b"BBBB")
    os.utime(target, ns=(st0.st_atime_ns, st0.st_mtime_ns))  # ctime still moves
    after = digest_path(tree, cache=cache)
    assert after.root != before.root
    assert after.root == digest(tree).root


def test_corrupt_cache_is_only_a_miss(tmp_path: Path) -> None:
    tree = build_golden(tmp_path / "t")
    path = tmp_path / datacache.CACHE_FILENAME
    path.write_bytes(b"this is not sqlite" * 100)
    assert digest_path(tree, cache=datacache.DigestCache(path)).root == digest(tree).root


@pytest.mark.usefixtures("no_racy_window")
def test_cache_rows_round_trip_unsigned_ids(tmp_path: Path) -> None:
    cache = datacache.DigestCache(tmp_path / "c.sqlite")
    key = datacache.StatKey(2**64 - 1, 2**63 + 5, 10, 1, 1)
    assert cache.store([(key, b"d" * 32)], started_ns=10**19) == 1
    assert cache.lookup([key, key._replace(size=11)]) == [b"d" * 32, None]
    cache.close()


@pytest.mark.usefixtures("no_racy_window")
def test_cache_lookup_serves_every_hard_link_and_rejects_stale_rows(tmp_path: Path) -> None:
    cache = datacache.DigestCache(tmp_path / "c.sqlite")
    key = datacache.StatKey(7, 2**63 + 1, 4, 5, 6)
    other = datacache.StatKey(8, 3, 4, 5, 6)
    assert cache.store([(key, b"a" * 32), (other, b"b" * 32)], started_ns=10**19) == 2
    stale = key._replace(ctime_ns=7)
    assert cache.lookup([key, other, key, stale]) == [b"a" * 32, b"b" * 32, b"a" * 32, None]
    cache.close()


def test_packed_rows_skip_racy_files_and_store_in_many_row_inserts(tmp_path: Path) -> None:
    started = 10**19
    calm = [(datacache.StatKey(1, i, i, 5, 6), bytes([i % 256]) * 32) for i in range(250)]
    racy = (datacache.StatKey(1, 999, 4, started - 1, 6), b"r" * 32)
    data = datacache.pack_rows([*calm, racy], started_ns=started)
    assert len(data) == 250 * datacache.ROW_SIZE
    cache = datacache.DigestCache(tmp_path / "c.sqlite")
    assert cache.store_packed(data) == 250
    assert cache.store_packed(b"") == 0
    keys = [k for k, _ in calm]
    assert cache.lookup([*keys, racy[0]]) == [d for _, d in calm] + [None]
    cache.close()


def test_unopenable_folder_in_pool_names_its_files(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    (tree / "a").mkdir(parents=True)
    (tree / "b").mkdir()
    for name in ("a/1", "a/2", "b/3"):
        (tree / name).write_bytes(b"x")
    real_open = os.open

    def deny(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if flags & os.O_DIRECTORY and os.fsencode(path).endswith(b"/a"):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(DataError, match=r"a/1 \(permission denied\); a/2 \(permission denied\)"):
        digest(tree)


def _tree_mode(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Force subtrees to workers; return a list that counts subtrees handed out."""
    monkeypatch.setattr(datawalk, "TREES_PER_JOB", 0)
    monkeypatch.setattr(datawalk, "EXPAND_LEVELS", 1)
    handed: list[int] = []
    real = datapool.hash_entries

    def counting(*args: object, **kwargs: object) -> datapool.Hashed:
        handed.append(len(kwargs.get("trees") or ()))  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("manifest.data.digest.hash_entries", counting)
    return handed


def test_subtrees_in_workers_give_the_same_listing(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    for name in ("a", "a.b", "a0", "b", "z"):
        (tree / name / "in").mkdir(parents=True)
        (tree / name / "f").write_bytes(name.encode())
        (tree / name / "in" / "g").write_bytes(b"g" * 5000)
    (tree / "a.c").write_bytes(b"top")
    (tree / "a" / "in" / "\xff-raw".encode("utf-8", "surrogateescape").decode(
        "utf-8", "surrogateescape")).write_bytes(b"x")
    os.symlink("../b", tree / "a" / "up")
    (tree / "z" / "big").write_bytes(b"\1" * (datareading.BIG_FILE + 3))
    one_walk = digest(tree)
    handed = _tree_mode(monkeypatch)
    assert digest(tree) == one_walk
    assert handed == [5]
    assert b"f\t3\t" in one_walk.listing  # a.c, between a.b's lines and a/'s


def test_file_deleted_in_a_subtree_after_its_walk(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    for name in ("a", "b"):
        (tree / name).mkdir(parents=True)
        (tree / name / "stays").write_bytes(b"y")
    (tree / "b" / "gone.bin").write_bytes(b"x")
    handed = _tree_mode(monkeypatch)
    real = datawalk.walk_tree

    def walk_then_delete(*args: Any) -> Any:
        found = real(*args)
        if args[1] == b"b":
            (tree / "b" / "gone.bin").unlink()
        return found

    monkeypatch.setattr(datadigest, "walk_tree", walk_then_delete)
    with pytest.raises(DataError, match=r"b/gone\.bin was removed while the dataset"):
        digest(tree)
    assert handed == [2]


def test_subtree_worker_killed_by_sigbus_is_redone(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / "t"
    for name in ("a", "b", "c"):
        (tree / name).mkdir(parents=True)
        (tree / name / "small").write_bytes(name.encode())
    (tree / "b" / "big").write_bytes(b"\2" * (datareading.BIG_FILE + 1))
    expected = digest(tree)

    def die(*args: object) -> datareading.FileResult:
        os.kill(os.getpid(), signal.SIGBUS)
        raise AssertionError("unreachable")

    handed = _tree_mode(monkeypatch)
    monkeypatch.setattr(dataworkers, "hash_mapped", die)
    assert digest(tree) == expected
    assert handed == [3]


def test_unreadable_directory_in_a_subtree_is_named(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads directories whatever their mode")
    tree = tmp_path / "t"
    (tree / "a" / "locked").mkdir(parents=True)
    (tree / "b").mkdir()
    _tree_mode(monkeypatch)
    (tree / "a" / "locked").chmod(0)
    try:
        with pytest.raises(DataError, match=r"a/locked \(permission denied\)"):
            digest(tree)
    finally:
        (tree / "a" / "locked").chmod(0o755)


def test_directory_walked_in_two_subtrees_is_named_once() -> None:
    ids = [(b"a/x", 1, 5), (b"b/y", 1, 5), (b"b/y/z", 1, 6), (b"a/x/z", 1, 6), (b"c", 1, 7)]
    assert datawalk.seen_twice(ids) == [
        (b"b/y", "is a directory already seen above it (a bind-mount loop)")]


# ------------------------------------------------------------ streamed listing


def _mixed_tree(root: Path) -> Path:
    for d in range(6):
        (root / f"d{d}" / "sub").mkdir(parents=True)
        for f in range(5):
            (root / f"d{d}" / f"f{f}").write_bytes(os.urandom(50 + f))
        (root / f"d{d}" / "sub" / "deep").write_bytes(b"deep")
    (root / "top.txt").write_bytes(b"top")
    return root


def test_listing_streamed_to_its_blob_is_the_listing_kept(tmp_path: Path, mode: str) -> None:
    tree = _mixed_tree(tmp_path / "t")
    kept = digest(tree)
    store = BlobStore(tmp_path / "store")
    streamed = digest_path(tree, cache=None, store=store, keep=False)
    assert (streamed.root, streamed.files, streamed.listing) == (kept.root, kept.files, b"")
    assert streamed.blob is not None and store.get(streamed.blob) == kept.listing
    dropped = digest_path(tree, cache=None, keep=False)
    assert (dropped.root, dropped.listing, dropped.blob) == (kept.root, b"", None)
    assert sorted(p.name for p in store.blobs.iterdir()) == [streamed.blob.replace(":", "-")]


def test_refused_tree_leaves_no_partial_blob(tmp_path: Path, mode: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _mixed_tree(tmp_path / "t")
    real = datapool.hash_entries

    def delete_then_hash(*args: object, **kwargs: object) -> datapool.Hashed:
        (tree / "top.txt").unlink()  # listed by the parent in every mode
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("manifest.data.digest.hash_entries", delete_then_hash)
    store = BlobStore(tmp_path / "store")
    with pytest.raises(DataError, match=r"top\.txt was removed while the dataset"):
        digest_path(tree, cache=None, store=store)
    assert list(store.blobs.iterdir()) == []


# ------------------------------------------------------------ subtree records


def _cached_subtrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                     ) -> tuple[Path, datacache.DigestCache, DatasetDigest]:
    monkeypatch.setattr(datacache, "RACY_WINDOW_NS", 0)
    _tree_mode(monkeypatch)
    tree = _mixed_tree(tmp_path / "t")
    cache = datacache.DigestCache(tmp_path / "store" / datacache.CACHE_FILENAME)
    return tree, cache, digest_path(tree, cache=cache)


def test_warm_subtree_takes_its_lines_from_its_record(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    tree, cache, cold = _cached_subtrees(tmp_path, monkeypatch)
    st = os.stat(tree / "d2")
    record = cache.tree_lookup(st.st_dev, st.st_ino)
    assert record is not None and record.files == 6
    assert record.text in cold.listing
    assert digest_path(tree, cache=cache) == cold
    # Positive control: the warm run used the record (a planted text shows up).
    with sqlite3.connect(cache.path) as conn:
        conn.execute("UPDATE trees SET text = ? WHERE ino = ?",
                     (record.text.replace(b"\tf0\n", b"\tf0-planted\n")
                      .replace(b"d2/f0", b"d2/f0-planted"), st.st_ino))
    assert b"d2/f0-planted" in digest_path(tree, cache=cache).listing
    assert digest_path(tree, cache=cache, no_cache=True) == cold


def test_subtree_record_misses_on_any_change(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tree, cache, cold = _cached_subtrees(tmp_path, monkeypatch)
    target = tree / "d4" / "f2"
    st0 = os.stat(target)
    target.write_bytes(b"B" * st0.st_size)  # same size, mtime forged back: ctime moves
    os.utime(target, ns=(st0.st_atime_ns, st0.st_mtime_ns))
    rewritten = digest_path(tree, cache=cache)
    assert rewritten.root != cold.root
    assert rewritten == digest(tree)
    os.rename(tree / "d1" / "f3", tree / "d1" / "f3-renamed")  # same inode, new name
    renamed = digest_path(tree, cache=cache)
    assert b"d1/f3-renamed" in renamed.listing
    assert renamed == digest(tree)
    (tree / "d0" / "sub" / "new").write_bytes(b"new")  # a file added deeper down
    assert digest_path(tree, cache=cache) == digest(tree)
