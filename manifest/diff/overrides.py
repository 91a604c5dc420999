"""Which differences the runs themselves made irrelevant: the facts behind the two
labels in :data:`manifest.diff.rules.REFINED` (pure functions over two manifests).

* **Seeds the script overrode.** ``--seed 0`` and ``--seed 1`` of a script
  that calls ``L.seed_everything(7)`` before drawing anything give identical
  weights: the launcher's seed never reached a draw. A generator counts as
  overridden in a process when the first recorded call that reseeds it found
  it not yet drawn from (the launcher compares fingerprints, exactly), and
  both runs made the same calls with the same seeds at the same sites (the
  calls themselves are compared as ``bits`` otherwise). A generator whose
  state at start is absent in both runs (numpy never imported, CUDA never
  initialised) does not count.
* **Generators the run never drew from.** A script that seeds torch itself
  and never touches ``random`` or numpy gives the same weights under
  ``--seed 0`` and ``--seed 1``, though the launcher seeded those two
  generators differently. A generator counts as never drawn from in a run
  when, in every process, its state at exit equals its state at start
  (exact fingerprints), and nothing can hide a draw: the process lists it
  in no ``unaccounted`` (a state restored from a saved one, draws before
  torch was imported), started no DataLoader workers and the run no worker
  process (``outputs.workers``: a worker draws from states no record
  holds), and no process ran outside the recipe. A state that was not
  recorded (null) never counts. Both runs must say so.
* **Packages the run never imported.** Only distributions whose modules a
  run imported, plus torch and its CUDA libraries, can change its bits; an
  old manifest without the imported list keeps every package as ``bits``.
"""

from __future__ import annotations

from manifest.models import Manifest, ProcessRandomness, SeedCall, always_counts

GENERATORS = ("python", "numpy", "torch_cpu", "cuda")


def _first_reseed(calls: list[SeedCall], generator: str) -> SeedCall | None:
    for call in calls:
        if generator in call.generators:
            return call
    return None


def _same_calls(a: list[SeedCall], b: list[SeedCall]) -> bool:
    return [(c.call, c.seed, c.site, c.generators) for c in a] == [
        (c.call, c.seed, c.site, c.generators) for c in b]


def _started(p: ProcessRandomness, generator: str) -> bool:
    fp = p.at_start
    if fp is None:
        return False
    value = getattr(fp, generator)
    return bool(value)


def overridden_generators(a: ProcessRandomness, b: ProcessRandomness) -> dict[str, str]:
    """Generators the script reseeded before any draw in both runs -> the call and its site."""
    calls_a, calls_b = a.reseeds or [], b.reseeds or []
    if not calls_a or not _same_calls(calls_a, calls_b):
        return {}
    found: dict[str, str] = {}
    for g in GENERATORS:
        first_a, first_b = _first_reseed(calls_a, g), _first_reseed(calls_b, g)
        if first_a is None or first_b is None:
            continue
        if g in first_a.drawn or g in first_b.drawn:
            continue
        found[g] = f"{first_a.call}({first_a.seed or ''}) at {first_a.site}"
    return found


NEVER_DRAWN = "never drawn from"
"""How a generator that no draw reached is named among the call sites of a seed line."""


def _never_drawn_in(m: Manifest, generator: str) -> bool:
    if m.outputs is None or m.outputs.workers or m.determinism.outside_recipe:
        return False
    outcomes = {o.rank: o for o in m.outputs.processes}
    if not m.randomness.processes or outcomes.keys() != {p.rank for p in m.randomness.processes}:
        return False
    for p in m.randomness.processes:
        if p.loaders or generator in (p.unaccounted or ()):
            return False
        end = outcomes[p.rank].at_exit
        start = getattr(p.at_start, generator) if p.at_start is not None else None
        if not start or end is None or getattr(end, generator) != start:
            return False
    return True


def never_drawn(a: Manifest, b: Manifest) -> frozenset[str]:
    """Generators that no process of either run drew from (see the module docstring)."""
    return frozenset(g for g in GENERATORS if _never_drawn_in(a, g) and _never_drawn_in(b, g))


def rank_seed_overridden(a: ProcessRandomness, b: ProcessRandomness,
                         unused: frozenset[str] = frozenset()) -> list[str] | None:
    """Call sites that made this rank's launcher seed irrelevant, or None if it still counts.

    ``unused``: generators no process drew from (:func:`never_drawn`), named
    :data:`NEVER_DRAWN`; each generator the seed reached must be one or the other.
    """
    found = overridden_generators(a, b)
    relevant = {g for g in GENERATORS if _started(a, g) or _started(b, g)}
    if not relevant or not relevant <= found.keys() | unused:
        return None
    return list(dict.fromkeys(
        found.get(g, f"{g}: {NEVER_DRAWN}") for g in GENERATORS if g in relevant))


def seed_overridden(a: Manifest, b: Manifest) -> list[str] | None:
    """Call sites that made the base seed irrelevant in every rank, or None."""
    ranks_a = {p.rank: p for p in a.randomness.processes}
    ranks_b = {p.rank: p for p in b.randomness.processes}
    if not ranks_a or ranks_a.keys() != ranks_b.keys():
        return None
    unused = never_drawn(a, b)
    sites: list[str] = []
    for rank, pa in ranks_a.items():
        found = rank_seed_overridden(pa, ranks_b[rank], unused)
        if found is None:
            return None
        sites.extend(s for s in found if s not in sites)
    return sites


def counts_for_bits(name: str, a: Manifest, b: Manifest) -> bool:
    """Whether a difference in package ``name`` can change the bits of these runs."""
    if always_counts(name):  # torch's family, unasked; torchvision … only when imported
        return True
    imported = [m.env.imported for m in (a, b) if m.env.imported is not None]
    if not imported:
        return True  # neither run says what it imported: fail safe
    return any(name in names for names in imported)


def reseed_notes(m: Manifest) -> list[str]:
    """The script's own seeding calls in words (capture's note, ``show``, lab's checklist):
    a call that reseeds before any draw decides the seed in force, so a report that said
    only "seed 0" would name a seed that reached nothing."""
    notes = []
    for rnd in m.randomness.processes if m.randomness is not None else []:
        for call in rnd.reseeds or []:
            if call.generators and not call.drawn:
                notes.append(f"{call.site} reseeds {', '.join(call.generators)} "
                             f"({call.call}({call.seed or ''})) before any draw: the "
                             "launcher's seed does not reach them")
            elif call.drawn:
                notes.append(f"{call.site} reseeds {', '.join(call.generators)} after "
                             f"{', '.join(call.drawn)} had been drawn from under the "
                             "launcher's seed")
    return list(dict.fromkeys(notes))  # every rank of a run reseeds at the same line
