"""Whose noise envelope may decide ``equivalent``: the one rule verify and diff share.

An envelope stored in a manifest is its author's numbers: every distance ×1e6 made a
planted learning rate ×1.01 ``equivalent`` (DESIGN, "What `equivalent` may claim"). So a
carried envelope decides only when (:func:`may_decide`):

* it passes the plausibility checks (``manifest.numeric.calibration.check_envelope``:
  no NaN, inf or negative distance, matching groups, a first step rounding can produce);
  one that fails is ignored and said so, never refused (the bits still answer); and
* the manifest is vouched for: sealed by this tool on this machine (``sealed``), or
  signed by an identity the trust policy trusts (``signed``). ``--trust`` lets a command
  run but vouches for no number.

verify asks with the trust decision of its plan; diff, which runs nothing and asks no
trust policy, with whether each side was sealed here (``vouched_by_seal``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from manifest.models import Envelope, Manifest

VOUCHING = ("sealed", "signed")
"""The trust bases under which a carried envelope may decide."""


@dataclass(frozen=True)
class Vouched:
    """A carried envelope, when it may decide; else None and why not."""

    envelope: Envelope | None
    whose: str | None = None
    """``the run's (sealed on this machine)`` or ``the run's, signed by <identity>``."""
    refusal: str | None = None
    problems: list[str] = field(default_factory=list)
    """Why the carried envelope was ignored (its plausibility checks), if it was."""


def may_decide(carried: Envelope | None, *, basis: str | None,
               reason: str | None = None) -> Vouched:
    """Whether the run's own envelope ``carried`` may decide, given how the manifest is
    vouched for (``basis``: ``sealed``, ``signed``, anything else: not vouched for;
    ``reason``: the trust decision's words, ``signed by …``)."""
    from manifest.numeric.calibration import check_envelope

    problems = check_envelope(carried) if carried is not None else []
    usable = None if problems else carried
    if usable is not None and basis in VOUCHING:
        whose = ("the run's (sealed on this machine)" if basis == "sealed" else
                 f"the run's, {reason or 'signed'}")
        return Vouched(usable, whose, problems=problems)
    why = ("the run carries no usable noise envelope" if usable is None else
           "the run's own noise envelope is its author's numbers, and the manifest was "
           "neither sealed on this machine nor signed by an identity you trust")
    return Vouched(None, refusal=why, problems=problems)


def vouched_by_seal(m: Manifest) -> str | None:
    """``sealed`` when this tool sealed ``m`` on this machine, else None (diff's basis)."""
    from manifest.trust import was_sealed_here

    return "sealed" if was_sealed_here(m.digest) else None
