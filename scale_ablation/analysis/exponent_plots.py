"""The exponent study's figures (experiments/dk_exponent.py; the fit is `analysis.exponent`):

- `loss_vs_c.png`: the validation metric against c, a panel per d_k, a line per init, each c at
  its own best LR (mean over seeds, 95% CI bars where n >= 2), the located c* marked (dashed
  where the claims take it for a bound: a grid or LR edge), the count
  baselines drawn as every report draws them;
- `c_star_vs_dk.png`: log c* against log d_k per init with its CI (analysis/located.py), the fitted line, and
  the range of c within 0.02 bits per byte of the best as a bar per d_k, and
  the three reference slopes through the fit's centre: 0 (the best scale ∝ 1/√d_k), −1/2 (1/d_k)
  and +1/2 (no divisor).

`figures(rows)` returns both when the rows hold the c·d_k^(-1/2) family at two c or more, else
nothing; the report's `plots.row_plots` adds them.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from scale_ablation.analysis import exponent, intervals, located, tolerance
from scale_ablation.analysis import plot_style as look
from scale_ablation.analysis.plot_groups import Grid
from scale_ablation.model import scale_family

TOLERANCE = 0.02  # bits per byte: exponent_claims.ScaleCost's margin
N_DRAWS = 400  # the c* lines only need the point estimates: few draws
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")  # one per init
BOUND_STYLE = "--"  # loss_vs_c's c* line where the claims count it as a bound, not a location
REFERENCES = ((0.0, "slope 0: 1/√d_k (α = −1/2)", "0.3", "--"),
              (-0.5, "slope −1/2: 1/d_k (α = −1)", "0.3", ":"),
              (0.5, "slope +1/2: no divisor (α = 0)", "0.3", "-."))


def _keys() -> look.Keys:
    return look.Keys(look.Style({}, {}))  # marks only: colours here are inits, not policies


def _inits(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(exponent.init_of(r) for r in rows
                              if scale_family.multiplier(r["policy"]) is not None))


def _draw_curve(ax, curve: exponent.CCurve, colour: str) -> None:
    means, halves = [], []
    for i in range(len(curve.cs)):
        values = [v[i] for v in curve.losses_by_seed.values() if v[i] is not None]
        estimate = intervals.mean_ci(values) if values else None
        means.append(np.nan if estimate is None else estimate.mean)
        halves.append(0.0 if estimate is None or estimate.n < 2 else estimate.half_width)
    ax.errorbar(curve.cs, means, yerr=halves, color=colour, marker="o", markersize=3,
                capsize=2, linewidth=1.2)


def plot_loss_vs_c(rows: list[dict], key: str = "final_val_bpb") -> Figure | None:
    curves = {init: exponent.c_curves(rows, init, key) for init in _inits(rows)}
    d_ks = sorted({d for by_dk in curves.values() for d in by_dk})
    if not d_ks:
        return None
    grid = Grid(tuple(d_ks), (None,))
    if len(d_ks) > 4:  # wrap: at most four panels a row
        grid = Grid((None,), tuple(f"d_k = {d}" for d in d_ks))
    fig, axes = look.panels(grid, sharey=True)
    keys, used, bounds = _keys(), set(), 0
    for k, (init, by_dk) in enumerate(curves.items()):
        colour = COLOURS[k % len(COLOURS)]
        keys.mark(f"{init} init", color=colour, marker="o")
        found = exponent.fit(rows, init, key, n_draws=N_DRAWS)
        for d_k, curve in by_dk.items():
            i, j = grid.index(f"d_k = {d_k}", d_k) if grid.wrapped else grid.index(None, d_k)
            ax, _ = axes[i][j], used.add((i, j))
            _draw_curve(ax, curve, colour)
            if (o := found.optima.get(d_k)) is not None:
                # A c* that the claims do not count (exponent.why_unsettled) is drawn dashed, so
                # the figure says what claims.md says.
                bound = d_k in found.unsettled
                bounds += bound
                ax.axvline(o.star, color=colour, linewidth=0.8, alpha=0.6,
                           linestyle=BOUND_STYLE if bound else "-")
    keys.mark("c* (located)", color="0.4", linewidth=0.8)
    if bounds:
        keys.mark("c*, not a location (grid or LR edge)", color="0.4", linewidth=0.8,
                  linestyle=BOUND_STYLE)
    for i, j in used:
        ax = axes[i][j]
        ax.set_xscale("log", base=2)
        ax.set_title(f"d_k = {d_ks[i * grid.shape[1] + j] if grid.wrapped else d_ks[j]}",
                     fontsize=9)
        look.baselines(ax, rows, "bpb", keys, corner="left")
    look.axis_labels(axes, used, "c  (scale = c / √d_k)", "final validation bits per byte, "
                     "each c at its best LR")
    n = max((len(c.losses_by_seed) for by in curves.values() for c in by.values()), default=1)
    return look.finish(fig, axes, used, keys, f"mean over seeds (n = {n})"
                       + ("\n95% CI where n ≥ 2" if n > 1 else ""))


def _clipped_ci(o: located.Located) -> tuple[float, float, bool]:
    """c*'s interval with an end beyond the grid drawn at the grid's edge (and flagged), never
    past c* itself (an edge c* is its grid value's log rounded to 9 digits: a hair outside)."""
    low, high = o.ci
    return min(max(low, o.grid[0]), o.star), max(min(high, o.grid[-1]), o.star), not o.bounded


def _tolerance_bars(ax, rows: list[dict], init: str, key: str, colour: str) -> None:
    """Per d_k, the c whose loss (each at its best LR) is within TOLERANCE of the best: a
    translucent bar, cut at the grid where the range reaches past it."""
    for d_k, grid in located.c_grids(exponent.init_rows(rows, init), key).items():
        try:
            found = tolerance.tolerance(grid, TOLERANCE, n_draws=N_DRAWS)
        except ValueError:  # no finished c, or one seed
            continue
        cs = [p[0] for p in grid]
        low, high = (math.exp(max(found.log_range[0], math.log(min(cs)))),
                     math.exp(min(found.log_range[1], math.log(max(cs)))))
        ax.plot([d_k, d_k], [low, high], color=colour, linewidth=6, alpha=0.15,
                solid_capstyle="butt")


def _fit_line(ax, found: exponent.ExponentFit, colour: str) -> tuple[float, float] | None:
    d_ks = sorted(found.optima)
    stars = [found.optima[d].star for d in d_ks]
    cis = [_clipped_ci(found.optima[d]) for d in d_ks]
    ax.errorbar(d_ks, stars, yerr=[[s - ci[0] for s, ci in zip(stars, cis, strict=True)],
                                   [ci[1] - s for s, ci in zip(stars, cis, strict=True)]],
                color=colour, marker="o", linestyle="none", capsize=2)
    # An interval that reaches past the grid: an open triangle at the edge it reaches.
    for d, ci in zip(d_ks, cis, strict=True):
        o = found.optima[d]
        if ci[2]:
            ends = [e for e, inf in ((ci[0], o.log_ci[0] == -math.inf),
                                     (ci[1], o.log_ci[1] == math.inf)) if inf]
            ax.plot([d] * len(ends), ends, "^", color=colour, markerfacecolor="none",
                    markersize=6)
    edges = [d for d in d_ks if d in found.unsettled]
    ax.plot(edges, [found.optima[d].star for d in edges], "x", color=colour, markersize=9)
    if found.slope is None:
        return None
    x = np.log(np.array(found.settled, dtype=float))
    y = np.log(np.array([found.optima[d].star for d in found.settled]))
    centre = (float(x.mean()), float(y.mean()))
    span = np.array([min(d_ks), max(d_ks)], dtype=float)
    ax.plot(span, np.exp(centre[1] + found.slope * (np.log(span) - centre[0])), color=colour)
    return centre


def _references(ax, centre: tuple[float, float], d_ks: list[int], keys: look.Keys) -> None:
    """The three candidate slopes through the fit's centre (mean log d_k, mean log c*)."""
    span = np.array([min(d_ks), max(d_ks)], dtype=float)
    for slope, label, colour, style in REFERENCES:
        ax.plot(span, np.exp(centre[1] + slope * (np.log(span) - centre[0])), color=colour,
                linestyle=style, linewidth=1)
        keys.mark(label, color=colour, linestyle=style)


def plot_c_star(rows: list[dict], key: str = "final_val_bpb") -> Figure | None:
    """A panel per init: c* per d_k with its CI, the fit, and the references through its centre."""
    fits = [f for init in _inits(rows) if (f := exponent.fit(rows, init, key)).optima]
    if not fits:
        return None
    fig, axes = look.panels(Grid(tuple(range(len(fits))), (None,)), sharey=True)
    keys, d_ks = _keys(), sorted({d for f in fits for d in f.optima})
    for k, found in enumerate(fits):
        ax, colour = axes[0][k], COLOURS[k % len(COLOURS)]
        keys.mark("c* (95% CI, LR re-chosen) and the OLS fit", color="0.2", marker="o")
        keys.mark(f"c within {TOLERANCE:g} bits per byte of the best", color="0.2",
                  linewidth=6, alpha=0.15)
        if any(not o.bounded for o in found.optima.values()):
            keys.mark("△: CI reaches past the grid's c", color="0.2", marker="^",
                      linestyle="none", markerfacecolor="none")
        _tolerance_bars(ax, rows, found.init, key, colour)
        if (centre := _fit_line(ax, found, colour)) is not None:
            _references(ax, centre, d_ks, keys)
        if found.unsettled:
            keys.mark("x: c* not a location (grid edge)", color="0.2", marker="x",
                      linestyle="none")
        ci = found.alpha_ci
        alpha = ("no fit" if found.alpha is None else f"α = {found.alpha:+.2f} "
                 + ("" if ci is None else "CI past the grid" if not all(map(math.isfinite, ci))
                    else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"))
        ax.set_title(f"{found.init} init: {alpha}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xticks(d_ks, [str(d) for d in d_ks], fontsize=7)
        ax.minorticks_off()
    used = {(0, k) for k in range(len(fits))}
    look.axis_labels(axes, used, "d_k (q/k width per head)", "c*: the best c of c / √d_k")
    n = max(f.n_seeds for f in fits)
    return look.finish(fig, axes, used, keys, f"n = {n} seeds per point")


def figures(rows: list[dict]) -> dict[str, Figure]:
    """The study's two figures, or {} when the rows hold fewer than two c of the family."""
    cs = {scale_family.multiplier(r["policy"]) for r in rows} - {None}
    if len(cs) < 2:
        return {}
    out = {"loss_vs_c.png": plot_loss_vs_c(rows), "c_star_vs_dk.png": plot_c_star(rows)}
    return {name: fig for name, fig in out.items() if fig is not None}
