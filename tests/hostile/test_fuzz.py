"""Mutation fuzzing of a real manifest over show, diff and verify --no-rerun.

Seeded random mutations of ``tests/golden/manifest_v1.json``: a value
anywhere replaced by a hostile one (markup, control characters, lone
surrogates, NUL, huge or negative numbers, wrong types, deep nesting), a
member dropped or added, list entries duplicated, raw bytes flipped, inserted
or cut. Most mutants are re-sealed (``run_id`` and ``digest`` recomputed) so
they get past the integrity check and reach the renderers and the verify
pipeline. Every call goes through ``manifest.cli.app.main`` in-process; the
test fails on an exception that escapes it, on "internal error", on a
traceback, on an exit status outside 0-3, or on a raw terminal control
character in what the tool printed.

The default run (``MANIFEST_FUZZ_CALLS``, 480 calls) takes about 30 s here;
the issue's 15,000-call run is ``MANIFEST_FUZZ_CALLS=15000``. The machine
probe verify runs once per call is memoised (it reads this machine, not the
manifest, and is not what is fuzzed).
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from manifest.canonical import compute_digest, compute_run_id
from manifest.cli import app as cli

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "manifest_v1.json"
CALLS = int(os.environ.get("MANIFEST_FUZZ_CALLS", "480"))
SEED = int(os.environ.get("MANIFEST_FUZZ_SEED", "20261123"))

HOSTILE: list[Any] = [
    "", "[/data/a]", "data.classes=[cat,dog]", "[bold red]x[/]", "\x1b[2J\x1b[H", "a\rb",
    "\u202eexe.txt", "\x00", "a\x00b", "\x7f\x85\u2028", "\ud800", "\udfff\ud800",
    "../x", "/nonexistent/../x", "/dev/null", "/proc/self/status", "out/[x]*.pt", "**",
    "blake3:" + "0" * 64, "blake3:zz", "x" * 10_000, "é" * 50, "\U0001f600",
    0, -1, 1, 2**53 - 1, 2**53, 2**63, -(2**63), 10**30, 1.5, -0.0, 1e308, True, False,
    None, [], {}, [[[[[[[[]]]]]]]], {"a": {"b": {"c": []}}}, ["x", 1, None], {"": ""},
]
STRINGS = [v for v in HOSTILE if isinstance(v, str)]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


def _mutate_doc(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for _ in range(rng.choice((1, 1, 2, 3))):
        paths = [p for p in _paths(doc) if p]
        path = rng.choice(paths)
        parent = _parent(doc, path)
        op = rng.random()
        value = parent[path[-1]]
        if op < 0.45 and isinstance(value, str):
            # Type-preserving: these pass validation and reach every renderer.
            parent[path[-1]] = rng.choice(STRINGS)
        elif op < 0.6:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
        elif op < 0.7 and isinstance(parent, dict):
            del parent[path[-1]]
        elif op < 0.8 and isinstance(parent, dict):
            parent[rng.choice(HOSTILE[:12])] = copy.deepcopy(rng.choice(HOSTILE))
        elif op < 0.9 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
        else:
            value = parent[path[-1]]
            if isinstance(value, str):
                cut = rng.randrange(len(value) + 1)
                parent[path[-1]] = value[:cut] + rng.choice(HOSTILE[:12]) + value[cut:]
            elif isinstance(value, int) and not isinstance(value, bool):
                parent[path[-1]] = value + rng.choice((-1, 1, 2**53, -(2**40)))
    return doc


def _seal(doc: dict[str, Any]) -> dict[str, Any]:
    from manifest.errors import ManifestError

    try:
        doc["run_id"] = compute_run_id(doc)
        doc["digest"] = compute_digest(doc)
    except (ManifestError, TypeError, ValueError):
        return doc  # not canonicalisable (a lone surrogate, a huge int): names left stale
    return doc


def _encode(doc: dict[str, Any], rng: random.Random) -> bytes:
    text = json.dumps(doc, ensure_ascii=rng.random() < 0.5, separators=(",", ":"),
                      sort_keys=rng.random() < 0.8)
    return text.encode("utf-8", "surrogatepass")


def _mutate_bytes(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    op = rng.random()
    if op < 0.4:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif op < 0.7:
        at = rng.randrange(len(data))
        data[at:at] = rng.choice([b"\\u0000", b"\\ud800", b'"', b"[", b"}", b"9" * 5000,
                                  b"NaN", b"\xff\xfe", b'\\"[/x]', b"1e999"])
    else:
        data = data[: rng.randrange(len(data))]
    return bytes(data)


def _mutant(golden: dict[str, Any], raw: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.15:
        return _mutate_bytes(raw, rng)
    doc = _mutate_doc(golden, rng)
    if rng.random() < 0.85:
        doc = _seal(doc)
    return _encode(doc, rng)


class _Streams:
    """sys.stdout/stderr as the CLI sees them (text over bytes), read back after each call."""

    def __init__(self) -> None:
        self.out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")
        self.err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace")

    def text(self) -> tuple[str, str]:
        texts = []
        for stream in (self.out, self.err):
            stream.flush()
            buffer = stream.buffer
            assert isinstance(buffer, io.BytesIO)
            texts.append(buffer.getvalue().decode("utf-8", "replace"))
        return texts[0], texts[1]


RAW_CONTROL = [chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, 0x9b)] + [
    "\u202e", "\u2028"]


def _call(argv: list[str], where: str) -> tuple[str | None, int]:
    """Run the CLI in-process; (what went wrong or None, exit status; -1 if it escaped)."""
    streams = _Streams()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams.out, streams.err
    escaped = None
    try:
        code = cli.main(argv)
    except BaseException as exc:  # an escape is exactly what we look for
        code, escaped = -1, f"{type(exc).__name__}: {exc}"
    finally:
        sys.stdout, sys.stderr = old
    out, err = streams.text()
    if escaped is not None:
        return f"{argv[:-1]} {where}: escaped {escaped}", code
    if code not in (0, 1, 2, 3) or "internal error" in err or "Traceback" in err:
        return f"{argv[:-1]} {where}: exit {code}: {err[:300]!r}", code
    if "--json" not in argv and any(ch in out or ch in err for ch in RAW_CONTROL):
        return f"{argv[:-1]} {where}: raw control character shown", code
    return None, code


VERBS = [["show"], ["show"], ["diff", str(GOLDEN)], ["diff", "--json", str(GOLDEN)],
         ["diff", "--all", "OTHER"], ["verify", "--no-rerun"], ["show", "--format", "markdown"],
         ["diff", "--format", "markdown", str(GOLDEN)]]


def _fuzz(tmp_path: Path, calls: int, verbs: list[list[str]],
          stop_after: int = 5) -> tuple[dict[int, int], list[str]]:
    """Run ``calls`` mutants through the CLI; (exit status counts, crash descriptions)."""
    raw = GOLDEN.read_bytes()
    golden = json.loads(raw)
    rng = random.Random(SEED)
    crashes: list[str] = []
    codes: dict[int, int] = {}
    for i in range(calls):
        path = tmp_path / f"m{i % 4}.json"
        path.write_bytes(_mutant(golden, raw, rng))
        other = tmp_path / f"m{(i + 1) % 4}.json"
        argv = [*(str(other if other.exists() else GOLDEN) if a == "OTHER" else a
                  for a in rng.choice(verbs)), str(path)]
        problem, code = _call(argv, f"seed {SEED} call {i}")
        codes[code] = codes.get(code, 0) + 1
        if problem:
            crashes.append(problem)
        if len(crashes) >= stop_after:
            break
    return codes, crashes


@pytest.fixture
def fuzz_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from manifest.capture import snapshot

    machine = snapshot.probe_machine()
    monkeypatch.setattr(snapshot, "probe_machine", lambda *a, **k: machine)
    monkeypatch.chdir(tmp_path)  # verify --no-rerun looks at the tree around cwd: an empty dir
    monkeypatch.setenv("COLUMNS", "120")
    return tmp_path


def test_mutation_fuzz_show_diff_verify(fuzz_env: Path) -> None:
    codes, crashes = _fuzz(fuzz_env, CALLS, VERBS)
    print(f"fuzz: {sum(codes.values())} calls, exit codes {dict(sorted(codes.items()))}, "
          f"{len(crashes)} crashes")
    assert not crashes, "\n".join(crashes)
    assert codes.get(0, 0) + codes.get(1, 0) > CALLS // 10  # mutants do reach the renderers


def test_positive_control_the_fuzzer_finds_a_plain_renderer(
        fuzz_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from manifest.cli import render

    monkeypatch.setattr(render, "markup", str)  # show as it was: recorded strings as markup
    monkeypatch.setattr(render, "shell_join", " ".join)
    _, crashes = _fuzz(fuzz_env, 400, [["show"]], stop_after=1)
    assert crashes, "the fuzzer did not notice unescaped markup in show"


def _pack_of_golden() -> bytes:
    """A real pack (``manifest.travel.pack``) of the golden manifest with blobs it names."""
    from manifest.canonical import dumps, seal
    from manifest.travel.pack import build_pack

    doc = json.loads(GOLDEN.read_bytes())
    patch, listing = b"diff --git a/x b/x\n", b"manifest-tree/v1\n"
    names = {"blake3:" + blake3.blake3(b).hexdigest(): b for b in (patch, listing)}
    doc["code"]["diff_digest"] = "blake3:" + blake3.blake3(patch).hexdigest()
    for ds in doc["data"]:
        ds["listing"] = "blake3:" + blake3.blake3(listing).hexdigest()
    return build_pack(dumps(seal(doc)), names)


def test_pack_mutation_fuzz(fuzz_env: Path) -> None:
    raw = _pack_of_golden()
    path = fuzz_env / "run.pack"
    path.write_bytes(raw)
    problem, code = _call(["show", str(path)], "unmutated pack")
    assert problem is None and code == 0  # positive control: the pack itself reads
    rng = random.Random(SEED)
    crashes: list[str] = []
    for i in range(max(CALLS // 3, 50)):
        data = bytearray(raw)
        op = rng.random()
        if op < 0.5:
            for _ in range(rng.randint(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif op < 0.8:
            data = data[: rng.randrange(len(data))]
        else:
            at = rng.randrange(len(data))
            data[at:at] = rng.randbytes(rng.randint(1, 50))
        path.write_bytes(bytes(data))
        verb = rng.choice([["show"], ["diff", str(GOLDEN)], ["verify", "--no-rerun"]])
        problem, _ = _call([*verb, str(path)], f"pack seed {SEED} call {i}")
        if problem:
            crashes.append(problem)
    assert not crashes, "\n".join(crashes[:5])
