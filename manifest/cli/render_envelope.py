"""A noise envelope for people: its bound per step as text, and a plot.

The plot (PNG, matplotlib when the ``plot`` extra is installed; None without it) draws,
on a log scale, each rounding-only run's relative parameter distance from the base run
step by step, the bound ``equivalent`` is judged against
(``manifest.numeric.envelope.bounds``), and any further curves the caller passes (a
re-run, planted changes), so the gap between rounding and a real change can be seen. A
curve that starts late (the runs matched number for number until then) gets the bound
it is judged against, drawn dotted from where it parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from manifest.models import Envelope, NumericPoint


def envelope_lines(envelope: Envelope,
                   trail: Sequence[NumericPoint] | None = None) -> list[str]:
    """The envelope in a few lines: how it was measured, its bound at milestone steps: the
    bound the verdict uses (``calibration.verdict_calibration``; ``trail``: the recorded
    run's numeric trail, else the loss's rounding unit the envelope carries)."""
    from manifest.numeric.calibration import resolution, verdict_calibration
    from manifest.numeric.envelope import milestones

    fitted = verdict_calibration(envelope, trail)
    seen = resolution(fitted)
    runs = "; ".join(envelope.runs)
    lines = [f"noise envelope: {len(envelope.runs)} rounding-only runs ({runs}), "
             f"{len(envelope.steps)} steps; a rounding-only re-run falls outside about 1 "
             f"time in {fitted.one_in:.0f} (margin ×{fitted.margin:.3g} over the runs' mean "
             f"curve)" + ("" if seen is None else
                          f"; smallest change seen at the first step: {seen:.2g} (relative)")]
    lines.extend(f"  note: {note}" for note in fitted.notes)
    for bound in milestones(envelope, trail):
        lines.append(f"  step {bound.step:>6}: parameters {max(bound.groups, default=0.0):.2g}, "
                     f"loss {bound.loss:.2g} (relative)")
    return lines


def envelope_png(envelope: Envelope, others: Mapping[str, Sequence[tuple[int, float]]]
                 | None = None, *, title: str = "noise envelope",
                 trail: Sequence[NumericPoint] | None = None) -> bytes | None:
    """Per-step parameter distances (group 0 … summed as the largest group) on a log scale."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io

    from manifest.numeric.envelope import bounds

    steps = [s.step for s in envelope.steps]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, label in enumerate(envelope.runs):
        ys = [max((g[i] for g in s.groups), default=0.0) for s in envelope.steps]
        ax.plot(steps, [y if y > 0 else float("nan") for y in ys], color="tab:gray",
                lw=1, alpha=0.8, label=f"rounding only: {label}")
    limit = bounds(envelope, trail)
    ax.plot([b.step for b in limit], [max(b.groups, default=0.0) for b in limit],
            color="black", lw=2, ls="--", label="bound (equivalent below)")
    palette = ("tab:blue", "tab:red", "tab:orange", "tab:green", "tab:purple", "tab:brown")
    for k, (label, points) in enumerate((others or {}).items()):
        xs = [s for s, y in points if y > 0]
        ys = [y for _, y in points if y > 0]
        ax.plot(xs, ys, color=palette[k % len(palette)], lw=1.5, marker=".", label=label)
        if xs and limit and xs[0] > limit[0].step:
            # A run that matched number for number until it parted is judged against the
            # envelope's curve from its start (``judge``): drawn from where it parts.
            shifted = [(xs[0] + b.step - limit[0].step, max(b.groups, default=0.0))
                       for b in limit if xs[0] + b.step - limit[0].step <= steps[-1]]
            ax.plot([x for x, _ in shifted], [y for _, y in shifted],
                    color=palette[k % len(palette)], lw=1, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("relative L2 distance of the parameters")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
