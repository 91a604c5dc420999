"""The environment variables a run's own code read: from process records to the manifest.

The launcher records, per process, each variable the script's own code read,
where, and the blake3 of the value (``launch/boot/_manifest_environ``). This
module makes ``determinism.processes[*].environ`` of that, and says what
differs between a run and its re-run (verify).

**What is kept.** Variables compared elsewhere are dropped by their exact
names, so one cause is one line: the numerics allow-list (``env.variables``),
the code-path variables (``command.code_env``), the topology's launcher and
NCCL variables (``command.topology``), rendezvous addresses and ports (they
name machines, a fresh port per torchrun), and this tool's own control
variables (:data:`LAUNCHER_VARIABLES`). Never by prefix: ``SLURM_ARRAY_TASK_ID``
picks an honest sweep's hyper-parameter, and a script's own ``MANIFEST_LR`` or
an ``NCCL_*`` the topology does not list is an input like any other.

**No plain digest.** A plain blake3 of a short value is the value (a 4-digit
PIN comes back from 10,000 guesses in 0.01 s), and no rule on names finds
every secret (``ADMIN_PIN``, ``OTP``, ``DB_PW``). Each value is kept as a
digest keyed with the user's key (:func:`keyed_digest`, below), and the read
names the key by its blake3 (``key``): where the key is held, values compare;
under another key, the value is "not compared" (:data:`OTHER_KEY`), the name,
site and set/unset still are; without the key, no dictionary leads back to a
value. No key (none can be read or made): site and set/unset only.

**Secrets.** A name that looks like a secret's (``HF_TOKEN``,
``WANDB_API_KEY``: :func:`manifest.redact.is_secret_name`, the project's one
rule; ``PWD`` is the working directory), or a value that the same redactor would
change (``DATABASE_URL=postgresql://alice:hunter2@db/prod``: URL userinfo, token
shapes, secret-named query parameters, the value of a secret-named variable;
checked in the run's process, which alone sees the value: ``"secret": true`` in
its record), keeps in identity its site and whether it was set, never a plain
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
``os.environ["USER"]``) gets one run_id per machine; that is what it read. And
since the digest is keyed, a script that reads any variable gets one run_id per
key: two users capture the same run under two run_ids unless they share the
key file.
Reads by libraries (``os.path.expanduser`` reading ``HOME``, torch reading
``TORCH_HOME``) never count, nor do the variables above that vary per
launch (``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``), so the
example training scripts keep their run_ids (none reads a variable of its own).
Which reads count, and what is not seen, is the launcher hook's docstring.

**Not recorded is not "none read".** The field is left out while empty, so a
manifest made before the launcher recorded reads looks like one that read
none. ``outputs.processes[*].environ_recorded`` (outside identity) says the
launcher recorded them, and how many names it dropped past its limit of 256;
reads are compared only for ranks both manifests recorded, and verify says
once, ``benign``, when one did not (:func:`unrecorded_on_one_side`; the first
release named every variable of such a re-run "read only by the re-run", a
false ``bits`` cause).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from manifest.launch.boot import _manifest_wire as wire
from manifest.launch.boot._manifest_wire import ProcessRecord
from manifest.launch.process import Process, read_process
from manifest.models import EnvRead, EnvReadsRecorded, KeyedRead, Manifest

_ADDRESSES = frozenset({"MASTER_ADDR", "MASTER_PORT"})
LAUNCHER_VARIABLES = frozenset({
    wire.CONFIG_VAR, wire.RECORDS_VAR, wire.OPS_VAR, "MANIFEST_OPS_DEVICE_SUMS",
    wire.SEGMENT_VAR, wire.RESUME_VAR, wire.PROBE_VAR, wire.AUDIT_VAR,
    "MANIFEST_DEBUG", wire.SEALED_RUN_VAR, "MANIFEST_ENTRY", "MANIFEST_DIR",
})
"""The launcher's own control variables, by exact name: capture and verify set them per
launch (a replay's segment, the records' directory), so they say how the run was launched,
not what it computes. Any other ``MANIFEST_*`` a script reads is its input."""


def compared_elsewhere(name: str) -> bool:
    """Whether another field of the manifest already records this variable by its exact name
    (or it names a machine or a launch, not the run): not kept among the run's reads. Only
    exact names: ``SLURM_ARRAY_TASK_ID``, which picks a sweep's hyper-parameter, or an
    ``NCCL_*`` setting outside the topology's list, is the script's input like any other."""
    from manifest.capture.observed import CODE_ENV_VARS
    from manifest.launch.boot._manifest_topology import LAUNCH_VARS, NCCL_VARS
    from manifest.probes.env import NUMERICS_VARIABLES

    return (name in NUMERICS_VARIABLES or name in CODE_ENV_VARS or name in LAUNCH_VARS
            or name in NCCL_VARS or name in _ADDRESSES or name in LAUNCHER_VARIABLES)


def is_secret(name: str, item: dict[str, Any]) -> bool:
    """Whether a read's value is a secret: by its name (:func:`manifest.redact.is_secret_name`)
    or by its shape, which the launcher checked with the same redactor in the run's process
    (``"secret": true``: a value ``redact_text`` or ``redact_url`` would change)."""
    from manifest.redact import is_secret_name

    return is_secret_name(name) or item.get("secret", False) is not False


def environ_reads(raw: Any, key: bytes | Literal["user"] | None = "user"
                  ) -> dict[str, EnvRead] | None:
    """A process record's ``environ`` as manifest entries (None when nothing counts): each
    value by a digest keyed with ``key`` (:func:`keyed_digest`; by default this user's,
    :func:`_machine_key`), never the plain one the process recorded; with no key, by its
    site and set/unset alone."""
    from pydantic import ValidationError

    if not isinstance(raw, dict):
        return None
    if key == "user":
        key = _machine_key() if raw else None
    out: dict[str, EnvRead] = {}
    key_id = key_name(key) if key is not None else None
    for name, item in raw.items():
        if not isinstance(name, str) or not isinstance(item, dict) or compared_elsewhere(name):
            continue
        plain = item.get("digest")
        digest = (keyed_digest(key, plain) if key is not None and isinstance(plain, str)
                  and not is_secret(name, item) else None)
        try:
            out[name] = EnvRead(site=str(item.get("site")), set=bool(item.get("set")),
                                digest=digest, key=key_id if digest is not None else None)
        except ValidationError:
            continue
    return dict(sorted(out.items())) or None


def key_name(key: bytes) -> str:
    """The key's name in a manifest: its blake3, which tells two keys apart and gives
    nothing of 32 random bytes back."""
    import blake3

    return "blake3:" + str(blake3.blake3(key).hexdigest())


def keyed_digest(key: bytes, plain: str) -> str:
    """A value's digest keyed with ``key``: blake3 in keyed mode over the value's plain
    blake3 (which the run's process computed and which leaves no process record): without
    the key, no dictionary of values leads back to it."""
    import blake3

    return "blake3:" + str(blake3.blake3(plain.encode(), key=key).hexdigest())



def environ_recorded(record: ProcessRecord | Process) -> EnvReadsRecorded | None:
    """That a process record has its reads (the launcher recorded them), with the count of
    names it dropped past its limit; None for a record without them."""
    from pydantic import ValidationError

    process = record if isinstance(record, Process) else read_process(record)
    if process.environ is None:
        return None
    try:
        return EnvReadsRecorded(names=len(process.environ), dropped=process.environ_dropped)
    except ValidationError:
        return None


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
    if not isinstance(raw, dict):
        return None
    plain = {name: item["digest"] for name, item in raw.items()
             if isinstance(name, str) and isinstance(item, dict) and is_secret(name, item)
             and not compared_elsewhere(name) and isinstance(item.get("digest"), str)}
    if not plain:
        return None
    key = _machine_key()
    if key is None:
        return None
    key_id = key_name(key)
    return {name: KeyedRead(key=key_id, digest=keyed_digest(key, digest))
            for name, digest in sorted(plain.items())}


OTHER_KEY = ("its value is not compared: the two runs digested it under different keys "
             "(each user's environ.key; copy one to the other machine to compare values)")
"""Said (benign) for a variable both runs read whose digests are keyed differently."""

NOT_RECORDED = ("not compared: one run did not record the environment variables its code "
                "read (made before the launcher recorded them)")
"""The one sentence said when only one side recorded the reads (verify and diff)."""


def recorded_ranks(m: Manifest) -> set[int]:
    """The ranks whose environment reads this manifest recorded (possibly none read): the
    marker says so, or reads were kept (the first release wrote no marker)."""
    ranks = {p.rank for p in m.determinism.processes if p.environ is not None}
    if m.outputs is not None:
        ranks |= {p.rank for p in m.outputs.processes if p.environ_recorded is not None}
    return ranks


def unrecorded_on_one_side(a: Manifest, b: Manifest) -> set[int]:
    """Ranks present in both whose reads only one of the two manifests recorded."""
    ranks_a = {p.rank for p in a.determinism.processes}
    ranks_b = {p.rank for p in b.determinism.processes}
    return (ranks_a & ranks_b) & (recorded_ranks(a) ^ recorded_ranks(b))


def _reads(m: Manifest) -> dict[int, dict[str, EnvRead]]:
    return {p.rank: p.environ or {} for p in m.determinism.processes}


def read_changes(recorded: Manifest, again: Manifest) -> list[tuple[str, str]]:
    """(path, sentence) for each variable the run read whose value the re-run did not see
    again: another value, set in one and unset in the other. A variable only one of them
    read is named too (the other's code took another path). Only ranks whose reads both
    manifests recorded are compared (:func:`reads_not_compared` says which are not)."""
    out: list[tuple[str, str]] = []
    now = _reads(again)
    both = recorded_ranks(recorded) & recorded_ranks(again)
    for rank, reads in sorted(_reads(recorded).items()):
        other = now.get(rank)
        if other is None or rank not in both:
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
            elif (a.digest != b.digest and a.digest is not None and b.digest is not None
                  and a.key == b.key):
                out.append((path, f"{who}{name}, read by {a.site}, has another value in the "
                                  "re-run: the run's inputs differ"))
    out.extend(_secret_changes(recorded, again, len(now) > 1))
    return out


def reads_not_compared(recorded: Manifest, again: Manifest) -> list[tuple[str, str]]:
    """(path, sentence), benign: said once when some rank's reads only one manifest recorded
    (one made before the launcher recorded them), per variable whose two digests are keyed
    differently (:data:`OTHER_KEY`), and per rank whose reads went past the launcher's limit
    (the names past it are not in the list, so not compared)."""
    out: list[tuple[str, str]] = []
    ranks = sorted(unrecorded_on_one_side(recorded, again))
    if ranks:
        which = "the re-run" if ranks[0] in recorded_ranks(recorded) else "the recorded run"
        out.append((f"determinism.processes[{ranks[0]}].environ",
                    f"environment variables read by the run's code: {NOT_RECORDED}; "
                    f"{which} did not"))
    now = _reads(again)
    for rank, reads in sorted(_reads(recorded).items()):
        for name, a in sorted(reads.items()):
            b = now.get(rank, {}).get(name)
            if (b is not None and a.digest is not None and b.digest is not None
                    and a.key != b.key):
                out.append((f"determinism.processes[{rank}].environ[{name}].key",
                            f"{name}, read by {a.site}: {OTHER_KEY}"))
    for label, m in (("the recorded run", recorded), ("the re-run", again)):
        for process in (m.outputs.processes if m.outputs is not None else []):
            kept = process.environ_recorded
            if kept is not None and kept.dropped:
                out.append((f"outputs.processes[{process.rank}].environ_recorded.dropped",
                            f"rank {process.rank} of {label} read {kept.dropped} variables "
                            f"past the launcher's limit, besides the {kept.names} it kept: "
                            "those are not compared"))
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
