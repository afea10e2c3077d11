"""The rank mesh of a :class:`~ezpz_nb.verify.Report`, each rank coloured by the rule it broke."""

from __future__ import annotations

from typing import Any, Protocol

from ezpz_nb.verify.verdict import RULES

__all__ = ["RULE_COLORS", "mesh_figure"]

#: One colour per rule (colour-blind-safe Okabe-Ito hues); passing ranks are light grey.
RULE_COLORS = {
    "tp_identical": "#E69F00",
    "dp_disjoint": "#D55E00",
    "exactly_once": "#CC79A7",
    "equal_steps": "#0072B2",
    "global_batch": "#009E73",
    "reshuffle": "#56B4E9",
    "resume": "#F0E442",
    "worker_memory": "#000000",
}
_OK = "#EEEEEE"


class Judged(Protocol):
    """What the figure reads of a report (a :class:`~ezpz_nb.verify.Report` has it all).

    A protocol, not the Report class: the report draws its figure through this
    module, so this module must not import the report (no import circle).
    """

    what: str
    layout: dict[str, int]

    @property
    def violations(self) -> list[Any]: ...  # the findings that break a rule

    @property
    def verdict(self) -> str: ...  # "pass", "fail" or "not judged"


def _rank_rules(report: Judged) -> dict[int, list[str]]:
    """Rules each rank broke, in the order of :data:`RULES` (violations only)."""
    out: dict[int, list[str]] = {}
    for f in report.violations:
        for r in sorted({*f.ranks, *([f.rank] if f.rank is not None else [])}):
            if f.rule not in out.setdefault(r, []):
                out[r].append(f.rule)
    order = list(RULES)
    return {r: sorted(v, key=order.index) for r, v in out.items()}


def mesh_figure(report: Judged) -> Any:
    """Draw the ``dp`` rows by ``cp x tp`` columns of ranks, coloured by their first broken rule.

    A rule broken by no rank in particular (samples never seen) is named in the
    title. Returns the matplotlib Figure (not shown; a notebook displays it).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    dp, tp, cp = report.layout["dp"], report.layout["tp"], report.layout.get("cp", 1)
    cols = cp * tp
    broken = _rank_rules(report)
    fig, ax = plt.subplots(figsize=(1.3 * cols + 2.8, 1.0 * dp + 1.2))
    for rank in range(dp * cols):
        row, col = divmod(rank, cols)
        rules = broken.get(rank, [])
        color = RULE_COLORS[rules[0]] if rules else _OK
        ax.add_patch(Rectangle((col, dp - 1 - row), 0.92, 0.88, color=color, ec="black", lw=0.6))
        label = f"rank {rank}\n" + ("\n".join(rules[:2]) if rules else "ok")
        ax.text(col + 0.46, dp - 1 - row + 0.44, label, ha="center", va="center", fontsize=8)
    ax.set_xlim(-0.1, cols + 0.1)
    ax.set_ylim(-0.1, dp + 0.1)
    ax.set_xticks([c + 0.46 for c in range(cols)])
    ax.set_xticklabels([f"cp {c // tp}, tp {c % tp}" if cp > 1 else f"tp {c}" for c in range(cols)])
    ax.set_yticks([dp - 1 - r + 0.44 for r in range(dp)])
    ax.set_yticklabels([f"dp {r}" for r in range(dp)])
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    unplaced = sorted({f.rule for f in report.violations if not f.ranks and f.rank is None})
    # "not judged" reads as the table's headline does: never a bare verdict that looks like a pass
    shown = "NOT ALL JUDGED" if report.verdict == "not judged" else report.verdict.upper()
    title = f"{shown}: {report.what}"
    if unplaced:
        title += "\nalso broken (no single rank): " + ", ".join(unplaced)
    ax.set_title(title, fontsize=9)
    used = sorted({r for v in broken.values() for r in v}, key=list(RULES).index)
    handles = [Patch(color=RULE_COLORS[r], label=RULES[r][0]) for r in used]
    handles.append(Patch(color=_OK, label="no rule broken"))
    ax.legend(
        handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False
    )
    fig.tight_layout()
    # Out of pyplot's list: the notebook shows the returned figure, and the inline backend
    # would show a figure pyplot still holds a second time when the cell ends.
    plt.close(fig)
    return fig
