"""Timeline (Gantt chart) of one training iteration of a plan, from the schedule simulation.

One row per pipeline stage: forward (blue) and backward (orange, recomputation and TP collectives included) of
every micro-batch and model chunk as simulated by :func:`hetplan.estimate.schedule.simulate`, then the stage's
exposed data-parallel communication (grey) and the optimizer step (green). Used by ``hetplan estimate
--timeline out.png``. matplotlib is imported only when drawing (``pip install hetplan[plot]``).
"""

from __future__ import annotations

from pathlib import Path

from hetplan.plan import Plan
from hetplan.estimate.arrays import Array


def timeline_data(plan: Plan, catalog: Array = None, model: Array = None, virtual_stages: int | None = None,
                  profiles: Array = None):
    """``(estimate, bars)``: ``bars`` is a list of ``(stage, kind, microbatch, chunk, start_s, end_s)`` with
    kind ``"F"``, ``"B"``, ``"DP"`` or ``"OPT"`` (seconds from the iteration start)."""
    from hetplan.estimate.estimator import estimate_detailed

    est, sim, costs, _ = estimate_detailed(plan, catalog, model, profiles, virtual_stages=virtual_stages, record=True)
    bars = [(op.stage, op.kind, op.microbatch, op.chunk, op.start_s, op.end_s) for op in sim.ops]
    after = max(end + float(c.dp_exposed_s) for end, c in zip(sim.stage_end_s, costs))
    for i, (end, c) in enumerate(zip(sim.stage_end_s, costs)):
        d = float(c.dp_exposed_s)
        if d > 0:
            bars.append((i, "DP", -1, 0, end, end + d))
        bars.append((i, "OPT", -1, 0, after, after + float(c.optimizer_s)))
    return est, bars


def draw_timeline(plan: Plan, path: str | Path, *, catalog: Array = None, model: Array = None,
                  virtual_stages: int | None = None,
                  profiles: Array = None, label_microbatches: bool | None = None) -> Path:
    """Draw the iteration timeline of ``plan`` to ``path`` (PNG/SVG/PDF by extension) and return the path.

    Args:
        catalog, model, virtual_stages, profiles: as for :func:`hetplan.estimate.estimator.estimate`.
        label_microbatches: write micro-batch numbers in the bars (default: when there are few bars).
    Raises:
        HetplanError: as :func:`~hetplan.estimate.estimator.estimate`; ImportError: matplotlib is missing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    est, bars = timeline_data(plan, catalog, model, virtual_stages, profiles)
    p = plan.pp
    colors = {"F": "#4C72B0", "B": "#DD8452", "DP": "#8C8C8C", "OPT": "#55A868"}
    label = label_microbatches if label_microbatches is not None else len(bars) <= 400
    fig, ax = plt.subplots(figsize=(12, 0.45 * p + 1.9))
    for stage, kind, mb, chunk, start, end in bars:
        shade = 1.0 if chunk % 2 == 0 else 0.65
        ax.barh(p - 1 - stage, (end - start) * 1e3, left=start * 1e3, height=0.8, color=colors[kind],
                alpha=shade, edgecolor="white", linewidth=0.3)
        if label and mb >= 0 and (end - start) * 1e3 > 0:
            ax.text((start + end) / 2 * 1e3, p - 1 - stage, str(mb), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {p - 1 - i}" for i in range(p)])
    ax.set_xlabel("time (ms)")
    sched = "interleaved 1F1B" if est.virtual_stages > 1 else plan.schedule.upper()
    ax.set_title(f"{plan.job.model}: {sched}" + (f" (v={est.virtual_stages})" if est.virtual_stages > 1 else "")
                 + f", pp={p}, m={plan.num_microbatches(0)} — iteration {est.iteration_time_s * 1e3:.1f} ms, "
                 f"bubble {100 * est.bubble_fraction:.1f} %", fontsize=9, loc="left", pad=18)
    ax.legend(handles=[Patch(color=colors[k], label=n) for k, n in
                       (("F", "forward"), ("B", "backward (+recompute)"), ("DP", "DP comm (exposed)"), ("OPT", "optimizer"))],
              loc="lower right", bbox_to_anchor=(1.0, 1.06), ncol=4, fontsize=7, frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
