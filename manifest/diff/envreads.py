"""diff's lines for environment reads that only one of the two runs recorded.

``determinism.processes[*].environ`` is left out of the document while it is
empty (so a run that reads no variable keeps the ``run_id`` it had before the
launcher recorded reads), which makes an absent field mean either "read
none" or "not recorded": a manifest made before the launcher recorded reads
has none, and comparing it with a new re-run named every variable the script
reads as "read only by the re-run: the code took another path" (a false
``bits`` cause). ``outputs.processes[*].environ_recorded`` (outside identity)
says which it is; a process with reads kept is recorded too (manifests of the
first release of the feature carry no marker). diff and verify compare the
reads of a rank only when both runs recorded them, and say once, ``benign``,
when one did not.

Which ranks recorded their reads is ``manifest.capture.environ`` (verify asks
it too); this module words diff's lines, as a refinement of the table
(``REFINED["environ-not-recorded"]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from manifest.capture.environ import OTHER_KEY, unrecorded_on_one_side
from manifest.diff.rules import REFINED, Impact, Rule
from manifest.models import Manifest

if TYPE_CHECKING:
    from manifest.diff.result import Difference

_READS = "determinism.processes[*].environ"
_MARKER = "outputs.processes[*].environ_recorded"
_DIGEST = "determinism.processes[*].environ[*].digest"


def relabel_unrecorded(found: list[Difference], a: Manifest, b: Manifest) -> list[Difference]:
    """diff's lines with a rank's reads that only one manifest recorded said once, benign:
    its ``environ`` line (``none → LRSCALE (train.py:4)``) relabelled, and the marker's own
    line dropped where that line says it; the marker's line alone otherwise."""
    from manifest.diff.reasons import reason_for
    from manifest.diff.result import Difference

    found = _relabel_other_key(found, a, b)
    ranks = unrecorded_on_one_side(a, b)
    if not ranks:
        return found
    said = {d.location[2] for d in found if d.rule == _READS and d.location[2] in ranks}
    rule = REFINED["environ-not-recorded"]
    out: list[Difference] = []
    for d in found:
        rank = d.location[2] if len(d.location) > 2 else None
        if rank not in ranks:
            out.append(d)
        elif d.rule == _READS:
            out.append(Difference(
                location=d.location, path=d.path, rule=d.rule, change=d.change,
                impact=Impact.BENIGN, before=d.before, after=d.after,
                reason=reason_for(rule, d.change, d.before, d.after, (rank,), d.path)))
        elif not (d.rule == _MARKER and rank in said):
            out.append(d)
    return out


_OTHER_KEY = Rule(Impact.BENIGN, "rank {keys[0]} {key}", "not compared: " + OTHER_KEY,
                  show_values=False)


def _relabel_other_key(found: list[Difference], a: Manifest, b: Manifest) -> list[Difference]:
    """A read's digest line relabelled benign where both runs digested a value and keyed
    their digests with different keys (each user's ``environ.key``): two digests of one
    value then differ, so the line says the value is not compared, never "another value"."""
    from manifest.diff.reasons import reason_for
    from manifest.diff.result import Difference

    keys_a = {(p.rank, n): r.key for p in a.determinism.processes
              for n, r in (p.environ or {}).items() if r.digest is not None}
    keys_b = {(p.rank, n): r.key for p in b.determinism.processes
              for n, r in (p.environ or {}).items() if r.digest is not None}
    out: list[Difference] = []
    for d in found:
        where = (d.location[2], d.location[4]) if len(d.location) > 4 else None
        if (d.rule == _DIGEST and where in keys_a and where in keys_b
                and keys_a[where] != keys_b[where]):
            d = Difference(location=d.location, path=d.path, rule=d.rule, change=d.change,
                           impact=Impact.BENIGN, before=d.before, after=d.after,
                           reason=reason_for(_OTHER_KEY, d.change, d.before, d.after,
                                             where, d.path))
        out.append(d)
    return out
