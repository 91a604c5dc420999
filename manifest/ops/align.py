"""Line two op streams up and name the first op that computes differently.

Alignment matches ops by (op name, module path) with ``difflib``'s
longest-matching-blocks, so a stream with extra or missing ops (a branch
taken in one run only, a different kernel decomposition) still lines up
around them, as PyTorch's fuzzy stream alignment does. Walking the matched
pairs in order, the first pair that disagrees is the answer:

* inputs equal, outputs differ: this op computed differently (a
  nondeterministic kernel, another thread count, library or device);
* an input differs that no earlier op of either stream produced, or a number
  passed to the op (``loss + np.random.rand()``) differs: the value entered
  from outside torch (Python or numpy data, ``os.urandom``, a clock, a file)
  at this op's source line;
* an input differs that an op present in only one stream produced, or after
  one stream ran ops the other did not (an in-place write through a view
  changes its base without any op returning it): the first such extra op
  (``missing``) or the op that read its value (``paths-differ``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from manifest.ops.stream import Op


@dataclass(frozen=True)
class Divergence:
    kind: str
    """``op-differs``, ``input-from-outside``, ``paths-differ`` or ``missing``."""
    a: Op | None
    b: Op | None
    position: int | None = None
    """Which input or output (flattened order) differs first."""
    only_in: str | None = None
    """For ``paths-differ``: which stream ran the extra op (``a`` or ``b``)."""


def first_divergence(a: list[Op], b: list[Op]) -> Divergence | None:
    """The first place two op lists disagree, or None when every op matches."""
    matcher = difflib.SequenceMatcher(None, [o.key for o in a], [o.key for o in b],
                                      autojunk=False)
    ia = ib = 0
    extra: Divergence | None = None
    for block in matcher.get_matching_blocks():
        # Ops the alignment skipped: a value they made that the other run lacks
        # is a path difference, not an outside one.
        unmatched_a, unmatched_b = a[ia:block.a], b[ib:block.b]
        if extra is None and (unmatched_a or unmatched_b):
            extra = (Divergence("missing", unmatched_a[0], None, only_in="a") if unmatched_a
                     else Divergence("missing", None, unmatched_b[0], only_in="b"))
        for k in range(block.size):
            x, y = a[block.a + k], b[block.b + k]
            found = _compare(x, y, unmatched_a, unmatched_b)
            if found is not None and found.kind == "input-from-outside" and extra is not None:
                # One run ran ops the other did not before this input differed: an
                # in-place write through a view (w.view(int)[0] += 1) changes its base
                # without any op returning it, so the extra op is the cause.
                return extra
            if found is not None:
                return found
            unmatched_a, unmatched_b = [], []
        ia, ib = block.a + block.size, block.b + block.size
    # Every matched op agreed: what is left is an op one run ran and the other did not.
    return extra


NUMBERS = "="
"""The prefix of the input entry that fingerprints an op's number arguments
(``manifest/launch/boot/_manifest_ops.py``: ``numbers_text``)."""


def _split(inputs: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """An op's tensor inputs, and its number arguments' entry (None without one)."""
    if inputs and inputs[-1].startswith(NUMBERS):
        return inputs[:-1], inputs[-1]
    return inputs, None


def _compare(x: Op, y: Op, skipped_a: list[Op], skipped_b: list[Op]) -> Divergence | None:
    if x.inputs != y.inputs:
        tensors_x, numbers_x = _split(x.inputs)
        tensors_y, numbers_y = _split(y.inputs)
        for pos, (fa, fb) in enumerate(zip(tensors_x, tensors_y, strict=False)):
            if fa == fb:
                continue
            made_by_skipped = any(fa in op.outputs for op in skipped_a) or any(
                fb in op.outputs for op in skipped_b)
            if made_by_skipped:
                return Divergence("paths-differ", x, y, pos, only_in="a" if skipped_a else "b")
            # Not made by any op, or made by a matched op whose outputs agreed and
            # then changed without an aten op (written through .numpy(), a buffer):
            # either way the difference came from outside torch.
            return Divergence("input-from-outside", x, y, pos)
        if len(tensors_x) != len(tensors_y):
            return Divergence("paths-differ", x, y, None)
        if numbers_x is not None and numbers_y is not None and numbers_x != numbers_y:
            # A Python or numpy number passed to the op differs: no op made it.
            return Divergence("input-from-outside", x, y, len(tensors_x))
        # One stream without the numbers' entry (recorded before they were): not compared.
    if x.outputs != y.outputs:
        out = next((i for i, (fa, fb) in enumerate(zip(x.outputs, y.outputs, strict=False))
                    if fa != fb), None)
        return Divergence("op-differs", x, y, out)
    return None
