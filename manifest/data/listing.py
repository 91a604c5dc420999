r"""Dataset digests: one BLAKE3 root for a file or a directory tree.

What a root proves
==================

**A regular file** has as root the plain BLAKE3 of its bytes, so
``manifest hash FILE`` prints what ``b3sum FILE`` prints (with ``blake3:``
in front).

**A directory** has as root the BLAKE3 *derive-key* hash, context
``"manifest dataset-tree v1"``, of its *listing* (below); the file digests in
the listing are the leaves, so this is a two-level Merkle tree. Keyed this
way a tree root can never equal the plain digest of some file. It can be
recomputed with the reference tool::

    b3sum --derive-key "manifest dataset-tree v1" listing.txt

The listing (format ``manifest-tree/v1``) is UTF-8 text: the header line
``manifest-tree/v1`` and then one line per entry below the root (the root
itself is not an entry), fields separated by TAB, each line ended by LF::

    f <size> <blake3 hex of content> <path>    regular file
    l <target> <path>                           symbolic link (never followed)
    d <path>                                    directory (so empty ones count)
    p <path> | s <path> | c <path> | b <path>   FIFO, socket, char/block device
                                                (recorded, never opened)

* ``<path>`` is relative to the root, components joined by ``/``.
* Entries are sorted by the raw *bytes* of that relative path (so by neither
  locale nor walk order nor filesystem), which makes the root independent of
  the machine and of the order the directory was read in.
* ``<path>`` and ``<target>`` are written in the *path text* encoding: the
  name decoded as UTF-8; each byte that is not part of valid UTF-8, each
  control character (U+0000-U+001F, U+007F) and the backslash are written as
  ``\xHH`` (backslash as ``\\``). The encoding is reversible, so names that
  are not UTF-8 survive without loss, and its output is valid UTF-8 that
  RFC 8785 accepts; the same encoding is used for ``Dataset.path`` and
  ``Dataset.name``. A name containing no byte listed above is written as is.
* Not in a digest: permissions (the executable bit included), owners,
  timestamps, hard-link identity, extended attributes. A dataset is its
  names and its bytes; permission bits vary with umask and copy tools.
* Hard links are listed, and hashed, once per path. Sizes are decimal.
* The top-level path is followed if it is a symbolic link; links below it
  are recorded as links (``l``), whether their target is inside the dataset,
  outside it, dangling, or a loop, and their target is never hashed.
* The repository's own store (``.manifest/``) is skipped when it lies inside
  the dataset: it changes while the dataset is being hashed.

``files`` counts regular files, ``bytes`` sums their sizes (a hard-linked
file counts once per path). The listing is kept as a blob in the store
(``Dataset.listing``) so ``verify`` can name the files that changed.

Refused, with one sentence and exit status 2 (a root is never recorded for
a tree it could not read completely): a path that does not exist, a dangling
top-level link or a link loop, a top-level FIFO/socket/device, files or
directories this user cannot read (all named), a file removed while the
dataset was hashed, a file that kept changing after :data:`ATTEMPTS` reads
(each read is checked by ``stat`` before and after), a directory that is
its own ancestor (a bind-mount loop).

The walk is in ``manifest.data.walk``; how the bytes are read (fork pool,
mmap only in disposable workers, stat checks) in ``manifest.data.reading`` and
``manifest.data.pool``; the cache that lets a second capture skip unchanged
files in ``manifest.data.cache``; ``manifest.data.digest`` puts them together.
"""

from __future__ import annotations

import re
import stat

import blake3

from manifest.errors import DataError

LISTING_HEADER = "manifest-tree/v1"
TREE_CONTEXT = "manifest dataset-tree v1"

# ---------------------------------------------------------------- path text

_NEEDS_ESCAPE = re.compile(rb"[\x00-\x1f\x7f\\\x80-\xff]")
_ESCAPE_CHARS = re.compile("[\x00-\x1f\x7f\\\\\udc80-\udcff]")
_UNESCAPE = re.compile(r"\\(?:x([0-9a-f]{2})|(\\))")


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group()
    if ch == "\\":
        return "\\\\"
    code = ord(ch)
    return f"\\x{code - 0xDC00 if code >= 0xDC80 else code:02x}"


def path_text(name: bytes) -> str:
    """The reversible, valid-UTF-8 text of a file name (see the module docstring)."""
    if not _NEEDS_ESCAPE.search(name):
        return name.decode("ascii")
    return _ESCAPE_CHARS.sub(_escape_char, name.decode("utf-8", "surrogateescape"))


def path_bytes(text: str) -> bytes:
    """The inverse of :func:`path_text`."""
    out = bytearray()
    pos = 0
    for match in _UNESCAPE.finditer(text):
        out += text[pos:match.start()].encode("utf-8")
        out += b"\\" if match.group(2) else bytes([int(match.group(1), 16)])
        pos = match.end()
    out += text[pos:].encode("utf-8")
    return bytes(out)


def tree_root(listing: bytes) -> str:
    return "blake3:" + blake3.blake3(listing, derive_key_context=TREE_CONTEXT).hexdigest()


def listing_root(listing: bytes) -> str:
    """Recompute the root a listing blob stands for (raises DataError if malformed)."""
    entries = parse_listing(listing)
    if len(entries) == 1 and b"" in entries:
        kind, fields = entries[b""]
        if kind != "f":
            raise DataError("the recorded listing is malformed: an unnamed entry is not a file.")
        return "blake3:" + fields[1]
    return tree_root(listing)


SPECIAL_KIND = {stat.S_IFIFO: "p", stat.S_IFSOCK: "s", stat.S_IFCHR: "c", stat.S_IFBLK: "b"}
KIND_WORD = {"f": "file", "l": "symlink", "d": "directory", "p": "FIFO", "s": "socket",
              "c": "character device", "b": "block device"}


def file_line(size: int, digest: bytes, rel: bytes) -> str:
    return f"f\t{size}\t{digest.hex()}\t{path_text(rel)}\n"


def parse_listing(listing: bytes) -> dict[bytes, tuple[str, list[str]]]:
    """Entries of a listing blob: relative path bytes -> (kind, other fields)."""
    try:
        text = listing.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError("the recorded dataset listing is not UTF-8 text.") from None
    lines = text.split("\n")
    if lines[0] != LISTING_HEADER or lines[-1] != "":
        raise DataError(f"the recorded dataset listing is not a {LISTING_HEADER} listing.")
    entries: dict[bytes, tuple[str, list[str]]] = {}
    arity = {"f": 4, "l": 3, "d": 2, "p": 2, "s": 2, "c": 2, "b": 2}
    for line in lines[1:-1]:
        fields = line.split("\t")
        if arity.get(fields[0]) != len(fields):
            raise DataError("the recorded dataset listing has a malformed line.")
        entries[path_bytes(fields[-1])] = (fields[0], fields[1:-1])
    return entries


def diff_listings(old: bytes, new: bytes, *, label: str = ".") -> list[str]:
    """One line per entry added, removed or changed between two listings."""
    before, after = parse_listing(old), parse_listing(new)
    changes: list[str] = []
    for rel in sorted(before.keys() | after.keys()):
        name = path_text(rel) or label
        if rel not in after:
            changes.append(f"removed: {name} ({KIND_WORD[before[rel][0]]})")
        elif rel not in before:
            changes.append(f"added: {name} ({KIND_WORD[after[rel][0]]})")
        elif before[rel] != after[rel]:
            (k0, f0), (k1, f1) = before[rel], after[rel]
            if k0 != k1:
                why = f"{KIND_WORD[k0]} -> {KIND_WORD[k1]}"
            elif k0 == "f":
                why = "content" if f0[0] == f1[0] else f"content, {f0[0]} -> {f1[0]} bytes"
            else:
                why = f"link target {f0[0]} -> {f1[0]}"
            changes.append(f"changed: {name} ({why})")
    return changes


