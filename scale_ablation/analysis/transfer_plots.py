"""The width-transfer study's figures (experiments/mup_transfer.py; the rule is `analysis.transfer`):

- `best_lr_vs_width.png`: the located best LR (`optimum.fit_optimum`, mean over seeds, the
  parabola's vertex) against width, log–log, a panel per parametrisation sharing one LR axis, a
  line per policy in the report's colour, its 95% CI (located.py) as error bars where
  n >= 2. An optimum at the grid's edge is a bound, drawn as a triangle pointing outward. The y
  axis is ticked at the grid's LRs, so "within one grid step" reads off the ticks; each panel
  names every line's max/min ratio over the widths against the grid's step.
- `loss_vs_lr_by_width.png` (mup's README figure): the validation bits per byte against LR, a
  curve per width, small multiples by (parametrisation, policy) on one y scale. A panel is in its
  policy's colour, the width in its shade (light: narrow, dark: wide); the located optimum is a
  star on each curve; a diverged LR an x on the top edge; the count baselines drawn or named.

`figures(rows, style)` returns both when the rows vary `model.d_model` over two widths or more
on an LR grid, else nothing; the report's `plots.row_plots` adds them.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import optimum, transfer
from scale_ablation.analysis import plot_groups as groups
from scale_ablation.analysis import plot_style as look

NAMES = {"sp": "SP", "mup": "μP", "umup": "u-μP"}
STYLES = {"sp": ("-", "o"), "mup": ("--", "s"), "umup": (":", "^")}  # line style, marker


# The x-axis label and the figures' file names per transfer axis.
LABELS = {transfer.WIDTH: ("width (d_model)", "width"),
          "override:model.head_dim": ("head dim (q, k, v per head)", "head_dim"),
          "override:model.qk_dim": ("q/k width per head", "qk_dim"),
          "override:model.num_layers": ("depth (layers)", "num_layers")}


def axis_of(rows: list[dict]) -> str | None:
    """The transfer axis the rows vary (two values or more), first of `LABELS`, or None. A head
    dim or q/k width counts only in a study of parametrisations (dk_sweep and dk_exponent vary
    them too, where a best LR per policy and head dim is not a transfer question)."""
    def varies(axis: str) -> bool:
        return len({r[axis] for r in rows if r.get(axis) not in (None, "")}) >= 2
    if varies(transfer.WIDTH):
        return transfer.WIDTH
    if not any(r.get(transfer.PARAMETRIZATION) not in (None, "") for r in rows):
        return None
    return next((axis for axis in LABELS if varies(axis)), None)


def _parametrizations(found: dict) -> list[str]:
    seen = list(dict.fromkeys(p for p, _ in found))
    return sorted(seen, key=lambda p: (p not in STYLES, list(STYLES).index(p) if p in STYLES else 0))


def _keys(style: look.Style) -> look.Keys:
    """The report's policy colours; no second-axis entries (the panels say the parametrisation)."""
    return look.Keys(look.Style(style.colours, {}))


def _shade(colour: str, k: int, count: int) -> tuple[float, float, float]:
    """The policy's colour mixed with white: the narrowest width lightest, the widest itself."""
    mix = 0.0 if count < 2 else 0.65 * (count - 1 - k) / (count - 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(colour))


def _draw_best(ax, by_width: dict[int, optimum.Optimum], line: dict, gid: str,
               keys: look.Keys, dodge: float) -> None:
    """The line of one policy, its x multiplied by `dodge` (a few percent) so that policies
    with the same optimum (the usual case on a ×2 grid) stay visible side by side."""
    widths = [w * dodge for w in sorted(by_width)]
    found = [by_width[w] for w in sorted(by_width)]
    stars = [o.lr_star for o in found]
    # An end past the grid (infinite) is drawn to the grid's edge.
    cis = [(max(ci[0], o.lrs[0]), min(ci[1], o.lrs[-1])) if (ci := o.lr_ci) else (s, s)
           for o, s in zip(found, stars, strict=True)]
    ax.plot(widths, stars, gid=gid, markersize=5, linewidth=1.4, **line)
    # An interval need not hold the point's vertex (a clamped draw): its bar then starts at it.
    low = [max(s - lo, 0.0) for s, (lo, _) in zip(stars, cis, strict=True)]
    high = [max(hi - s, 0.0) for s, (_, hi) in zip(stars, cis, strict=True)]
    if any(o.n_seeds >= 2 for o in found):
        ax.errorbar(widths, stars, yerr=[low, high], fmt="none", ecolor=line["color"],
                    capsize=3, linewidth=1)
    for w, o in zip(widths, found, strict=True):
        if o.edge is not None:  # a bound: the true optimum lies beyond the grid
            marker = "^" if o.edge == "high" else "v"
            ax.plot([w], [o.lr_star], marker, color=line["color"], markersize=11,
                    fillstyle="none")
            keys.mark(f"{marker}: best LR at the grid's {o.edge} edge (a bound)",
                      color="0.2", marker=marker, fillstyle="none", linestyle="none")


def _ratio_label(by_width: dict[int, optimum.Optimum], x: float, colour: str) -> tuple:
    """The line's max/min best LR over the widths, to stand right of its last point (x, y)."""
    ratio, _, edge = transfer.spread(by_width)
    text = f"×{ratio:.2g}{' (edge)' if edge else ''}"
    return x, by_width[max(by_width)].lr_star, text, colour


def _place_ratios(ax, labels: list[tuple], gap: float = 0.07) -> None:
    """Each label at its line's end, in the order the lines end from bottom to top, pushed
    apart to `gap` (a share of the axis height) so that lines ending together stay legible.
    Needs the panel's final log-y limits."""
    low, high = (np.log(v) for v in ax.get_ylim())
    labels = sorted(labels, key=lambda label: label[1])
    heights = [(np.log(y) - low) / (high - low) for _, y, _, _ in labels]
    for i in range(1, len(heights)):
        heights[i] = max(heights[i], heights[i - 1] + gap)
    overflow = max(heights[-1] - (1 - gap / 2), 0.0) if heights else 0.0
    for (x, y, text, colour), h in zip(labels, heights, strict=True):
        ax.annotate(text, xy=(x, y), xytext=(x * 1.1, h - overflow),
                    textcoords=("data", "axes fraction"), va="center", fontsize=7,
                    color=colour)


def _best_panel(ax, param: str, mine: list[tuple[str, dict]], style: look.Style,
                keys: look.Keys) -> list[tuple]:
    """One parametrisation's lines, a policy each, dodged sideways around the widths; returns
    their ratio labels (placed once the axis limits are final)."""
    labels = []
    linestyle, marker = STYLES.get(param, ("-", "o"))
    for k, (policy, by_width) in enumerate(mine):
        colour, dodge = style.colours.get(policy, "k"), 2 ** (0.05 * (k - (len(mine) - 1) / 2))
        keys.series(policy, "", min(o.n_seeds for o in by_width.values()))
        _draw_best(ax, by_width, {"color": colour, "linestyle": linestyle, "marker": marker},
                   f"{param}|{policy}", keys, dodge)
        labels.append(_ratio_label(by_width, max(by_width) * dodge, colour))
    ax.set_title(NAMES.get(param, param), fontsize=9)
    return labels


def plot_best_lr(rows: list[dict], style: look.Style,
                 axis: str = transfer.WIDTH) -> Figure | None:
    """A panel per parametrisation: the located best LR against `axis`, a line per policy."""
    found = {g: w for g, w in transfer.optima(rows, axis).items() if len(w) >= 2}
    if not found:
        return None
    params = _parametrizations(found)
    fig, axes = look.panels(groups.Grid(tuple(params), (None,)), sharey=True)
    keys, used = _keys(style), {(0, j) for j in range(len(params))}
    widths = sorted({w for by_width in found.values() for w in by_width})
    lrs = sorted({lr for by_width in found.values() for o in by_width.values() for lr in o.lrs})
    for j, param in enumerate(params):
        ax = axes[0][j]
        labels = _best_panel(ax, param, [(policy, by_width) for (p, policy), by_width
                                         in found.items() if p == param], style, keys)
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths], fontsize=7)
        ax.set_yscale("log")
        ax.set_yticks(lrs, [f"{lr:.2g}" for lr in lrs], fontsize=7)
        ax.minorticks_off()
        ax.grid(axis="y", color="0.9", linewidth=0.8)  # the grid's LRs: one step apart
        ax.set_ylim(lrs[0] / 1.5, lrs[-1] * 1.5)
        ax.set_xlim(widths[0] / 1.3, widths[-1] * 1.9)  # room for the ratios at the right
        _place_ratios(ax, labels)
    step = max(transfer.spread(by_width)[1] for by_width in found.values())
    along = transfer.AXES[axis]
    keys.mark(f"×r: max/min best LR over the {along} values;\ntransfers when r ≤ the grid step "
              f"×{step:.2g}", linestyle="none")
    look.axis_labels(axes, used, LABELS[axis][0], "located best learning rate")
    sizes = sorted(keys.sizes)
    n = f"n = {sizes[0]}" if sizes[0] == sizes[-1] else f"n = {sizes[0]}–{sizes[-1]}"
    ci = "\n95% CI (located.py) where n ≥ 2" if sizes[-1] >= 2 else ": no CI"
    seeds = "seed" if sizes[-1] == 1 else "seeds"
    return look.finish(fig, axes, used, keys, f"located optimum per {along}\n({n} {seeds}){ci}")


def _curve(runs: list[dict], key: str) -> list[groups.Point]:
    """Per LR: the mean and 95% CI of the completed runs' `key`."""
    by_lr: dict = defaultdict(list)
    for r in runs:
        if (v := cmp.finished_value(r, key)) is not None:
            by_lr[r["lr"]].append(v)
    return [groups.Point(lr, *groups.summarise(vs), len(vs)) for lr, vs in sorted(by_lr.items())]


def _diverged(ax, runs: list[dict], colour, keys: look.Keys) -> None:
    """An x on the top edge at each LR where a run diverged."""
    lrs = sorted({r["lr"] for r in runs if r["status"] == "diverged"})
    if lrs:
        ax.plot(lrs, [1.0] * len(lrs), "x", color=colour, markersize=7, clip_on=False,
                transform=ax.get_xaxis_transform())
        keys.mark("x (top edge): a run diverged", color="0.2", marker="x", linestyle="none")


def _draw_width(ax, points: list[groups.Point], colour, gid: str, dodge: float) -> None:
    """One width's curve; its error bars' x multiplied by `dodge` so the widths' bars at one LR
    stand apart."""
    ax.plot([p.x for p in points], [p.centre for p in points], gid=gid, color=colour,
            marker="o", markersize=3, linewidth=1.3)
    sized = [p for p in points if p.n >= 2]
    if sized:
        ax.errorbar([p.x * dodge for p in sized], [p.centre for p in sized],
                    yerr=[[p.centre - p.low for p in sized], [p.high - p.centre for p in sized]],
                    fmt="none", ecolor=colour, capsize=1.5, linewidth=0.8, alpha=0.7)


def _star(ax, best: optimum.Optimum, shade, keys: look.Keys) -> None:
    """The located optimum on its curve: filled when interior, hollow at the grid's edge."""
    if best.interior:
        ax.plot([best.lr_star], [best.loss_star], "*", color=shade, markersize=10,
                markeredgecolor="k", markeredgewidth=0.5, zorder=3)
        keys.mark("★ located optimum (fit)", color="0.5", marker="*", markersize=10,
                  markeredgecolor="k", markeredgewidth=0.5, linestyle="none")
        return
    ax.plot([best.lr_star], [best.loss_star], "*", color=shade, markersize=11, fillstyle="none",
            markeredgewidth=1.2, zorder=3)
    keys.mark("☆ best at the grid's edge (a bound)", color="0.3", marker="*", markersize=11,
              fillstyle="none", markeredgewidth=1.2, linestyle="none")


def _layout(runs: dict, params: list[str], policies: list[str]) -> groups.Grid:
    """Rows by parametrisation, columns by policy when every pair ran; otherwise the pairs that
    ran, side by side (a sparse grid would leave holes and panels without their y scale)."""
    if len(runs) == len(params) * len(policies):
        return groups.Grid(tuple(policies), tuple(params))
    return groups.Grid((None,), tuple(sorted(runs, key=lambda pair: (params.index(pair[0]),
                                                                     policies.index(pair[1])))))


def plot_loss_by_width(rows: list[dict], style: look.Style,
                       axis: str = transfer.WIDTH) -> Figure | None:
    """Small multiples by (parametrisation, policy): loss against LR, a curve per value of
    `axis` (a width, a head dim)."""
    key, _ = cmp.primary_metric(rows)
    found = transfer.optima(rows, axis)
    along = transfer.AXES[axis]
    runs: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        group = (str(r.get(transfer.PARAMETRIZATION, "sp")), r["policy"])
        runs[group][int(r[axis])].append(r)
    params = _parametrizations(runs)
    policies = sorted(dict.fromkeys(policy for _, policy in runs), key=list(style.colours).index)
    widths = sorted({w for by_width in runs.values() for w in by_width})
    grid = _layout(runs, params, policies)
    fig, axes = look.panels(grid, sharey=True)
    keys, used = _keys(style), set()
    for w in widths:
        keys.mark(f"{along} {w}", color=_shade("0.15", widths.index(w), len(widths)), linewidth=2)
    for (param, policy), by_width in runs.items():
        i, j = grid.index((param, policy), None) if grid.wrapped else grid.index(param, policy)
        ax, colour = axes[i][j], style.colours.get(policy, "k")
        used.add((i, j))
        for width, members in sorted(by_width.items()):
            k = widths.index(width)
            shade = _shade(colour, k, len(widths))
            if points := _curve(members, key):
                keys.series(policy, "", min(p.n for p in points))
                _draw_width(ax, points, shade, f"{param}|{policy}|{width}",
                            dodge=2 ** (0.06 * (k - (len(widths) - 1) / 2)))
            if (best := found.get((param, policy), {}).get(width)) is not None:
                _star(ax, best, shade, keys)
            _diverged(ax, members, shade, keys)
        ax.set_title(f"{NAMES.get(param, param)}, {policy}", fontsize=9, color=colour)
    for i, j in used:
        look.lr_ticks(axes[i][j], sorted({r["lr"] for r in rows}))
        look.baselines(axes[i][j], rows, "bpb", keys, corner="left")
    look.axis_labels(axes, used, "learning rate", "final validation bits per byte")
    return look.finish(fig, axes, used, keys, keys.title(
        f"hue: policy; shade: {along}\n(light small, dark large)\nmean over seeds"))


DEPTH_ALPHA = "override:model.depth_alpha"


def _with_depth_rule(row: dict) -> dict:
    """The row with CompleteP's α in its parametrisation's name ("mup α=0.5"), so that arms
    that differ only by `model.depth_alpha` get panels of their own; α 0 (off) adds nothing."""
    alpha = row.get(DEPTH_ALPHA)
    if alpha in (None, "") or not float(alpha):
        return row
    name = str(row.get(transfer.PARAMETRIZATION, "sp"))
    return {**row, transfer.PARAMETRIZATION: f"{name} α={float(alpha):g}"}


def figures(rows: list[dict], style: look.Style | None = None) -> dict[str, Figure]:
    """The study's two figures along the axis its rows vary (`axis_of`: d_model, the head dim
    or the q/k width, two values or more), or {} when they vary none on an LR grid."""
    axis = axis_of(rows)
    rows = [_with_depth_rule(r) for r in rows if axis and r.get(axis) not in (None, "")]
    if axis is None or not cmp.has_lr_grid(rows):
        return {}
    style, name = style or look.Style.of(rows), LABELS[axis][1]
    out = {f"best_lr_vs_{name}.png": plot_best_lr(rows, style, axis),
           f"loss_vs_lr_by_{name}.png": plot_loss_by_width(rows, style, axis)}
    return {name: fig for name, fig in out.items() if fig is not None}
