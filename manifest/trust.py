"""Whether verify may run a manifest's command: the one trust decision.

A manifest is data except for ``command``, which is code: running it is
running whatever its author wrote. ``digest`` is tamper evidence, not
authorship (it has no key: anyone who edits ``command.argv`` can re-seal), and
the old test, "the commit is in the local history", looked at the code the
command *would find*, never at the command itself. So verify runs the command
only when one of these holds, checked here and nowhere else:

(a) **sealed here**: this tool sealed a manifest with exactly this ``digest``
    on this machine. ``manifest capture`` appends every digest it seals to a
    record in the user's data directory (``$XDG_DATA_HOME/manifest/sealed``,
    default ``~/.local/share/manifest/sealed``; never in the repository, where
    a pull request could add to it). A digest covers every byte of the
    document, so an edited argv has another digest and is not found.
(b) **signed**: the caller verified a signature over the manifest by an
    identity the user's policy trusts and passes that identity as
    ``signer``. This module does not check signatures; the signing code
    (``manifest sign``) computes ``signer`` and owns the policy. ``None``
    means "no trusted signature".
(c) **--trust**: the user asked for it after verify showed exactly what will
    run (:class:`RunPlan`: argv, cwd, the variables it sets, the datasets it
    links), every string escaped so a control character cannot disguise it.

The record is one digest per line, appended with ``O_APPEND`` (a 72-byte line
is written whole even by concurrent captures) and read whole for a lookup:
100,000 captures make a 7 MB file, read in ~10 ms.
"""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from manifest.models import Manifest

RECORD_NAME = "sealed"
_DIGEST = re.compile(r"blake3:[0-9a-f]{64}")


def data_dir() -> Path:
    """The user's data directory for manifest (XDG base directory spec)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    # The spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".local" / "share"
    return root / "manifest"


def sealed_record() -> Path:
    return data_dir() / RECORD_NAME


def record_sealed(digest: str) -> bool:
    """Remember that this tool sealed ``digest`` here; False if the record cannot be written.

    A capture never fails because of it: the manifest is still written, and
    verifying it later needs ``--trust`` (or a signature).
    """
    if not _DIGEST.fullmatch(digest):
        return False
    path = sealed_record()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        os.write(fd, (digest + "\n").encode("ascii"))
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def was_sealed_here(digest: str) -> bool:
    """Whether :func:`record_sealed` saw ``digest`` on this machine (for this user)."""
    if not _DIGEST.fullmatch(digest):
        return False
    try:
        fd = os.open(sealed_record(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        wanted = digest.encode("ascii")
        return any(line.rstrip(b"\n") == wanted for line in fh)


@dataclass(frozen=True)
class TrustDecision:
    """Whether the command may run, and the one sentence that says why (or why not)."""

    allowed: bool
    reason: str
    """``sealed here``, ``signed by <identity>``, ``--trust``, or the refusal sentence."""
    basis: str
    """Machine-readable: ``sealed``, ``signed``, ``user``, or ``refused``."""


def check_trust(manifest: Manifest, *, manifest_digest: str | None = None,
                user_trusted: bool = False, signer: str | None = None) -> TrustDecision:
    """Decide whether verify may run ``manifest``'s command (see the module docstring).

    ``manifest_digest`` defaults to the manifest's own ``digest`` (already
    checked against its bytes by ``load_manifest``). ``signer`` is the
    identity of a signature the caller verified against the user's trust
    policy, or None.
    """
    digest = manifest_digest or manifest.digest
    if was_sealed_here(digest):
        return TrustDecision(True, "sealed here", "sealed")
    if signer:
        return TrustDecision(True, f"signed by {escape_text(signer)}", "signed")
    if user_trusted:
        return TrustDecision(True, "--trust", "user")
    return TrustDecision(
        False,
        "refusing to run the manifest's command: it was not sealed on this machine by "
        "manifest and carries no signature you trust",
        "refused")


# ------------------------------------------------------------------ the plan


_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def escape_text(text: str) -> str:
    """``text`` with every character that could act on a terminal shown escaped.

    Control characters (C0, DEL, C1), format characters (bidi overrides such
    as U+202E, zero-width joiners) and lone surrogates become ``\\xNN`` /
    ``\\uNNNN``; a backslash doubles so the escaping cannot be forged.
    """
    out: list[str] = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
            continue
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def quote_arg(arg: str) -> str:
    """One argv element, escaped, then shell-quoted when it needs quoting."""
    import shlex

    shown = escape_text(arg)
    return shlex.quote(shown) if shown else "''"


@dataclass(frozen=True)
class RunPlan:
    """Exactly what a re-run will execute, for the user to read before ``--trust``."""

    argv: list[str]
    cwd: str
    variables: dict[str, str]
    """Environment variables the re-run sets (recorded numerics variables and the launcher's)."""
    datasets: list[tuple[str, str]] = field(default_factory=list)
    """(path inside the tree, where it comes from), each made read-only where confined."""
    confinement: str = "not confined"
    network: bool = False

    def lines(self) -> list[str]:
        """The plan as text lines, every recorded string escaped."""
        out = [f"command: {' '.join(quote_arg(a) for a in self.argv)}",
               f"in: {escape_text(self.cwd)}"]
        for name in sorted(self.variables):
            out.append(f"sets: {escape_text(name)}={quote_arg(self.variables[name])}")
        for inside, source in self.datasets:
            out.append(f"links: {escape_text(inside)} -> {escape_text(source)} (read-only)")
        net = "network allowed (--network)" if self.network else "no network"
        out.append(f"confinement: {self.confinement}"
                   + (f", {net}" if self.confinement != "not confined" else ""))
        return out
