"""The environment variables a run's own code read: from process records to the manifest.

The launcher records, per process, each variable the script's own code read,
where, and the blake3 of the value (``launch/boot/_manifest_environ``). This
module makes ``determinism.processes[*].environ`` of that, and says what
differs between a run and its re-run (verify).

**What is kept.** Variables compared elsewhere are dropped, so one cause is
one line: the numerics allow-list (``env.variables``), the code-path
variables (``command.code_env``), the launcher's layout and NCCL variables
(``command.topology``), rendezvous addresses and ports (they name machines, a
fresh port per torchrun), and this tool's own ``MANIFEST_*``.

**Secrets.** A name that looks like a secret's (``HF_TOKEN``,
``WANDB_API_KEY``: :func:`manifest.redact.is_secret_name`, the project's one
rule) keeps in identity its site and whether it was set, never a plain
digest: a blake3 of a low-entropy secret (a 6-character password of
lower-case letters and digits is 36^6 ≈ 2·10^9 guesses, within one GPU's
reach) gives the secret back to anyone who holds the manifest. Its value is
compared instead by a digest keyed with 32 random bytes kept in the user's
data directory (``$XDG_DATA_HOME/manifest/environ.key``, 0600, made at first
use; never in the repository or the store, which travel):
``outputs.processes[*].secret_reads``, outside identity, since another
machine has another key and would give the same value another digest. verify
compares them when the re-run used the same key (it does on the machine that
captured); elsewhere a changed secret is not seen.

**Identity.** The field is in ``determinism`` and so in ``run_id``. DESIGN
says identity counts what the run used, and the one claim a run_id makes is
that two manifests with the same run_id and different outputs show
non-determinism: a script run under ``LRSCALE=1`` and ``LRSCALE=2`` with one
run_id would be called non-deterministic by diff. The cost is that a script
that reads a machine's own names itself (``os.environ["HOME"]``,
``os.environ["USER"]``) gets one run_id per machine; that is what it read.
Reads by libraries (``os.path.expanduser`` reading ``HOME``, torch reading
``TORCH_HOME``) never count, nor do the variables above that vary per
launch (``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``), so the
example training scripts keep their run_ids (none reads a variable of its own).
"""

from __future__ import annotations

import os
from typing import Any

from manifest.models import EnvRead, KeyedRead, Manifest

_ELSEWHERE_PREFIXES = ("MANIFEST_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "NCCL_")
_ADDRESSES = frozenset({"MASTER_ADDR", "MASTER_PORT"})


def compared_elsewhere(name: str) -> bool:
    """Whether another field of the manifest already records this variable (or it names a
    machine, not the run): not kept among the run's reads."""
    from manifest.capture.observed import CODE_ENV_VARS
    from manifest.launch.boot._manifest_topology import LAUNCH_VARS, NCCL_VARS
    from manifest.probes.env import NUMERICS_VARIABLES

    return (name in NUMERICS_VARIABLES or name in CODE_ENV_VARS or name in LAUNCH_VARS
            or name in NCCL_VARS or name in _ADDRESSES or name.startswith(_ELSEWHERE_PREFIXES))


def environ_reads(raw: Any) -> dict[str, EnvRead] | None:
    """A process record's ``environ`` as manifest entries (None when nothing counts)."""
    from pydantic import ValidationError

    from manifest.redact import is_secret_name

    if not isinstance(raw, dict):
        return None
    out: dict[str, EnvRead] = {}
    for name, item in raw.items():
        if not isinstance(name, str) or not isinstance(item, dict) or compared_elsewhere(name):
            continue
        digest = None if is_secret_name(name) else item.get("digest")
        try:
            out[name] = EnvRead(site=str(item.get("site")), set=bool(item.get("set")),
                                digest=digest)
        except ValidationError:
            continue
    return dict(sorted(out.items())) or None


KEY_NAME = "environ.key"


def _machine_key() -> bytes | None:
    """This user's key for secret digests (made at first use), or None where it cannot be
    read or made: then no keyed digest is recorded."""
    import secrets

    from manifest.trust import data_dir

    path = data_dir() / KEY_NAME
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                continue  # another capture made it first: read that one
            except OSError:
                return None
            key = secrets.token_bytes(32)
            with os.fdopen(fd, "wb") as fh:
                fh.write(key)
            return key
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            key = fh.read(33)
        return key if len(key) == 32 else None
    return None


def keyed_reads(raw: Any) -> dict[str, KeyedRead] | None:
    """The secret-looking variables of a process record's ``environ``, each by a keyed digest
    of the value's plain one (module docstring); None when there are none, or no key."""
    import blake3

    from manifest.redact import is_secret_name

    if not isinstance(raw, dict):
        return None
    plain = {name: item["digest"] for name, item in raw.items()
             if isinstance(name, str) and isinstance(item, dict) and is_secret_name(name)
             and not compared_elsewhere(name) and isinstance(item.get("digest"), str)}
    if not plain:
        return None
    key = _machine_key()
    if key is None:
        return None
    key_id = "blake3:" + blake3.blake3(key).hexdigest()
    return {name: KeyedRead(key=key_id, digest="blake3:" + blake3.blake3(
        digest.encode(), key=key).hexdigest()) for name, digest in sorted(plain.items())}


def _reads(m: Manifest) -> dict[int, dict[str, EnvRead]]:
    return {p.rank: p.environ or {} for p in m.determinism.processes}


def read_changes(recorded: Manifest, again: Manifest) -> list[tuple[str, str]]:
    """(path, sentence) for each variable the run read whose value the re-run did not see
    again: another value, set in one and unset in the other. A variable only one of them
    read is named too (the other's code took another path)."""
    out: list[tuple[str, str]] = []
    now = _reads(again)
    for rank, reads in sorted(_reads(recorded).items()):
        other = now.get(rank)
        if other is None:
            continue
        who = f"rank {rank}: " if len(now) > 1 else ""
        for name in sorted(reads.keys() | other.keys()):
            path = f"determinism.processes[{rank}].environ[{name}]"
            a, b = reads.get(name), other.get(name)
            if a is None and b is not None:
                out.append((path, f"{who}{name} was read only by the re-run (at {b.site}): "
                                  "the code took another path"))
                continue
            if a is None:
                continue
            if b is None:
                out.append((path, f"{who}{name}, read by {a.site}, was not read by the "
                                  "re-run: the code took another path"))
            elif a.set != b.set:
                state = "is unset in the re-run" if a.set else "is set in the re-run, unset then"
                out.append((path, f"{who}{name}, read by {a.site}, {state}: the run's "
                                  "inputs differ"))
            elif a.digest != b.digest and a.digest is not None and b.digest is not None:
                out.append((path, f"{who}{name}, read by {a.site}, has another value in the "
                                  "re-run: the run's inputs differ"))
    out.extend(_secret_changes(recorded, again, len(now) > 1))
    return out


def _secret_changes(recorded: Manifest, again: Manifest, ranks: bool) -> list[tuple[str, str]]:
    """Secret-looking variables whose keyed digests, under one key, differ."""
    if recorded.outputs is None or again.outputs is None:
        return []
    sites = _reads(recorded)
    now = {p.rank: p.secret_reads or {} for p in again.outputs.processes}
    out = []
    for process in recorded.outputs.processes:
        for name, then in sorted((process.secret_reads or {}).items()):
            later = now.get(process.rank, {}).get(name)
            if later is None or later.key != then.key or later.digest == then.digest:
                continue
            who = f"rank {process.rank}: " if ranks else ""
            read = sites.get(process.rank, {}).get(name)
            where = f", read by {read.site}," if read is not None else ""
            out.append((f"outputs.processes[{process.rank}].secret_reads[{name}]",
                        f"{who}{name}{where} has another value in the re-run (compared by a "
                        "digest keyed on this machine): the run's inputs differ"))
    return out
