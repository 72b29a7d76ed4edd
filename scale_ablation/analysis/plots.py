"""The report's plots: means over seeds, never per-seed lines, in bits per byte (MQAR: recall
accuracy), one colour per policy and one legend per figure (`plot_style`), small multiples when
a panel would hold more than eight series (`plot_groups`).

With an LR grid, curves over training and final values against d_k show each setting at its own
best LR (summary.md's "Best LR" table). Count baselines are grey lines, or named at the axis'
edge when off it. On loss-against-LR plots a diverged LR is an `x` on the top edge, and LRs with
a spiked or collapsed run carry a `^` or `v`. Max logits are geometric means over seeds (they
spread over decades), on log axes.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable

import numpy as np
from matplotlib.figure import Figure

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import exponent, exponent_plots, transfer_plots
from scale_ablation.analysis import plot_groups as groups
from scale_ablation.analysis import plot_style as look
from scale_ablation.records import metrics_rows as rm

LN2 = math.log(2)
_MARKS_EVERY = 6  # about this many markers per curve over training: style, not data points
# A curve over training needs a middle: with only the first and last evaluation (eval_every =
# steps) it is one segment from init to the end, the end values being loss_vs_lr's already.
_MIN_POINTS_OVER_TRAINING = 3


def _val_bpb(row: dict) -> float | None:
    """Validation bits per byte of a metrics row (val/loss is nats per byte)."""
    if row.get("val/bpb") is not None:
        return row["val/bpb"]
    return None if row.get("val/loss") is None else row["val/loss"] / LN2


def _zoom(ax, curves: list[list[groups.Point]], rows: list[dict]) -> None:
    """y over the second half of training, where the final gaps are, widened to the bigram
    baseline (the line a model must beat) when it lies below."""
    values = [v for points in curves for p in points if p.x >= points[-1].x / 2
              for v in (p.low, p.high)]
    bigram = [r["baseline_bigram_bpb"] for r in rows if r.get("baseline_bigram_bpb")]
    if not values:
        return
    low, high = min(values + bigram), max(values)
    pad = 0.08 * (high - low) or 0.05 * abs(high) or 0.1
    ax.set_ylim(low - pad, high + pad)


def _draw_series(ax, points: list[groups.Point], line: dict, gid: str, *,
                 band: bool, marks_every: int | None = None) -> None:
    """A mean line; its 95% CI as a band (`band`) or error bars, only at points with n >= 2."""
    xs, centres = [p.x for p in points], [p.centre for p in points]
    ax.plot(xs, centres, gid=gid, markevery=marks_every, markersize=4, linewidth=1.4, **line)
    sized = [p for p in points if p.n >= 2]
    if not sized:
        return
    if band:
        ax.fill_between([p.x for p in sized], [p.low for p in sized], [p.high for p in sized],
                        color=line["color"], alpha=0.15, linewidth=0)
    else:
        ax.errorbar([p.x for p in sized], [p.centre for p in sized],
                    yerr=[[p.centre - p.low for p in sized], [p.high - p.centre for p in sized]],
                    fmt="none", ecolor=line["color"], capsize=2, linewidth=1)


def plot_over_training(runs: list[dict], rows: list[dict], value_of: Callable, ylabel: str, *,
                       style: look.Style | None = None, unit: str | None = None,
                       zoom: bool = False, geometric: bool = False, log_y: bool = False,
                       extra: Callable | None = None) -> Figure | None:
    """One panel per d_k (rows of panels by second axis when crowded), one line per policy and
    second-axis value: the mean over seeds of `value_of(metrics row)`, with a 95% CI band;
    `geometric`: the geometric mean. `extra(ax, d_k, keys)` draws reference lines. None when
    no curve has a point between its ends."""
    style = style or look.Style.of(rows)
    chosen = groups.chosen_runs(runs, rows)
    curves = {key: groups.over_training([run for run, _ in members], value_of, geometric)
              for key, members in chosen.items()}
    curves = {key: points for key, points in curves.items() if points}
    if max(map(len, curves.values()), default=0) < _MIN_POINTS_OVER_TRAINING:
        return None
    grid = groups.grid(list(curves))
    names = groups.drop_repeats(chosen, grid, lambda members: tuple(id(r) for _, r in members))
    curves = {key: points for key, points in curves.items() if key in names}
    fig, axes = look.panels(grid)
    keys, used, drawn = look.Keys(style), set(), defaultdict(list)
    for (policy, second, d_k), points in curves.items():
        index = grid.index(second, d_k)
        used.add(index)
        drawn[index].append(points)
        keys.series(policy, second, min(p.n for p in points))
        ax, line = axes[index[0]][index[1]], style.line(policy, second)
        _draw_series(ax, points, line, f"{policy}|{second}|{d_k}", band=True,
                     marks_every=max(1, len(points) // _MARKS_EVERY))
        if any(row["status"] == "diverged" for _, row in chosen[(policy, second, d_k)]):
            ax.plot([points[-1].x], [points[-1].centre], "x", color=line["color"], markersize=9)
            keys.mark("x: a run diverged (line ends)", color="0.2", marker="x", linestyle="none")
    for i, j in used:
        ax, d_k = axes[i][j], grid.d_k(j)
        ax.set_title(grid.title(i, j), fontsize=9)
        if log_y:
            look.log_y(ax)
        if zoom:
            _zoom(ax, drawn[(i, j)], [r for r in rows if r["d_k"] == d_k])
        if extra:
            extra(ax, d_k, keys)
        if unit:
            look.baselines(ax, [r for r in rows if r["d_k"] == d_k], unit, keys)
    look.axis_labels(axes, used, "step", ylabel)
    best = " at its best LR" if cmp.has_lr_grid(rows) else ""
    mean = "geometric mean" if geometric else "mean"
    return look.finish(fig, axes, used, keys, keys.title(f"each setting{best}:\n{mean} over seeds"),
                       grid)


def _by_x(rows: list[dict], x_of: Callable, key: str, log_y: bool) -> list[groups.Point]:
    """Per x: the mean of the completed runs' `key` with its 95% CI (geometric for `log_y`);
    an accuracy's interval is cut at [0, 1], where the t-interval of a few seeds can overrun."""
    by_x: dict = defaultdict(list)
    for r in rows:
        if (v := cmp.finished_value(r, key)) is not None and (v > 0 or not log_y):
            by_x[x_of(r)].append(v)
    points = [groups.Point(x, *groups.summarise(vs, log_y), len(vs))
              for x, vs in sorted(by_x.items())]
    if "accuracy" in key:
        points = [groups.Point(p.x, p.centre, max(p.low, 0.0), min(p.high, 1.0), p.n)
                  for p in points]
    return points


DK_LABEL = "d_k (q/k width of a head)"
DEGRADATION = "final_val/bpb_degradation@"  # summary rows' keys, one per longer length L


def _at_best_lr(rows: list[dict]) -> list[dict]:
    """The runs at their setting's best LR (all runs without an LR grid)."""
    if not cmp.has_lr_grid(rows):
        return rows
    key, higher = cmp.primary_metric(rows)
    best = {(b.setting, b.d_k): b.lr for b in cmp.best_lrs(rows, key, higher)}
    return [r for r in rows if best.get((cmp.setting(r), r["d_k"]), r["lr"]) == r["lr"]]


def _log2_ticks(ax, values: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(values, [str(v) for v in values])
    ax.minorticks_off()


def plot_final_vs_dk(rows: list[dict], style: look.Style | None = None) -> Figure:
    """Final bits per byte (MQAR: accuracy) against d_k, one line per policy and second axis
    (each at its best LR with a grid), 95% CI error bars where n >= 2; `x` on the top edge at a
    d_k where a run of the series diverged at any LR."""
    style = style or look.Style.of(rows)
    key, higher = cmp.primary_metric(rows)
    second_of = groups.second_axis(rows)
    members, every = defaultdict(list), defaultdict(list)
    for r in rows:
        for second in second_of(r):
            every[(r["policy"], second)].append(r)
    for r in _at_best_lr(rows):
        for second in second_of(r):
            members[(r["policy"], second)].append(r)
    grid = groups.grid([(p, s, None) for p, s in every], by_dk=False)
    fig, axes = look.panels(grid, sharey=True)
    keys, used = look.Keys(style), set()
    for (policy, second), series in members.items():
        points = _by_x(series, lambda r: r["d_k"], key, log_y=False)
        i, j = grid.index(second, None)
        ax = axes[i][j]
        used.add((i, j))
        line = style.line(policy, second)
        if points:
            keys.series(policy, second, min(p.n for p in points))
            _draw_series(ax, points, line, f"{policy}|{second}", band=False)
        diverged = sorted({r["d_k"] for r in every[(policy, second)] if r["status"] == "diverged"})
        if diverged:
            ax.plot(diverged, [1.0] * len(diverged), "x", color=line["color"], clip_on=False,
                    transform=ax.get_xaxis_transform(), markersize=8)
            keys.mark("x (top edge): diverged", color="0.2", marker="x", linestyle="none")
    for i, j in used:
        ax = axes[i][j]
        _log2_ticks(ax, sorted({r["d_k"] for r in rows}))
        ax.set_title(grid.title(i, j), fontsize=9)
        look.baselines(ax, rows, "accuracy" if higher else "bpb", keys, corner="left")
    metric = "recall accuracy" if higher else "validation bits per byte"
    look.axis_labels(axes, used, DK_LABEL, f"final {metric}")
    best = " at its best LR" if cmp.has_lr_grid(rows) else ""
    return look.finish(fig, axes, used, keys, keys.title(f"each setting{best}:\nmean over seeds"),
                       grid)


def plot_against_lr(rows: list[dict], key: str, ylabel: str, *, unit: str | None,
                    log_y: bool = False, float16_line: bool = False, zero_line: bool = False,
                    style: look.Style | None = None) -> Figure | None:
    """Final `key` against the learning rate: one panel per d_k (rows by second axis when
    crowded), one line per policy and second axis with 95% CI error bars where n >= 2 (`log_y`:
    geometric mean and CI); diverged (x, top edge), spiked (^) and collapsed (v) LRs marked.
    `unit` draws its count baselines, `zero_line` the 0 a difference is read against."""
    style = style or look.Style.of(rows)
    second_of = groups.second_axis(rows)
    series = defaultdict(list)
    for r in rows:
        for second in second_of(r):
            series[(r["policy"], second, r["d_k"])].append(r)
    grid = groups.grid(list(series))
    series = groups.drop_repeats(series, grid, lambda members: tuple(map(id, members)))
    fig, axes = look.panels(grid)
    keys, used, centres = look.Keys(style), set(), defaultdict(list)
    for (policy, second, d_k), members in series.items():
        i, j = grid.index(second, d_k)
        used.add((i, j))
        line = style.line(policy, second)
        points = _by_x(members, lambda r: r["lr"], key, log_y)
        centres[(i, j)] += [p.centre for p in points]
        if points:
            keys.series(policy, second, min(p.n for p in points))
            _draw_series(axes[i][j], points, line, f"{policy}|{second}|{d_k}", band=False)
        _mark_unstable(axes[i][j], members, {p.x: p.centre for p in points}, line["color"], keys)
    for i, j in used:
        ax, d_k = axes[i][j], grid.d_k(j)
        look.lr_ticks(ax, sorted({r["lr"] for r in rows if r["d_k"] == d_k}))
        if log_y and centres[(i, j)]:
            look.log_y(ax, centres[(i, j)])
        if float16_line:
            look.float16_max(ax, rows, keys)
        if zero_line:
            look.no_degradation(ax, keys)
        if unit:
            look.baselines(ax, [r for r in rows if r["d_k"] == d_k], unit, keys, corner="left")
        ax.set_title(grid.title(i, j), fontsize=9)
    look.axis_labels(axes, used, "learning rate", ylabel)
    what = "geometric mean over seeds" if log_y else "mean over seeds"
    return look.finish(fig, axes, used, keys, keys.title(what), grid)


def _mark_unstable(ax, members: list[dict], centres: dict[float, float], colour: str,
                   keys: look.Keys) -> None:
    by_lr = defaultdict(list)
    for r in members:
        by_lr[r["lr"]].append(r)
    marks = (("spike_step", "^", "^: a run spiked"), ("collapse_step", "v", "v: a run collapsed"))
    for lr, runs in by_lr.items():
        if any(r["status"] == "diverged" for r in runs):
            ax.plot([lr], [1.0], "x", color=colour, markersize=8,
                    transform=ax.get_xaxis_transform(), clip_on=False)
            keys.mark("x (top edge): diverged", color="0.2", marker="x", linestyle="none")
        for field, marker, label in marks:
            if lr in centres and any(r.get(field) not in (None, "") for r in runs):
                ax.plot([lr], [centres[lr]], marker, color=colour, markersize=10,
                        fillstyle="none")
                keys.mark(label, color="0.2", marker=marker, fillstyle="none", linestyle="none")


def plot_learned_scale(rows: list[dict], style: look.Style | None = None) -> Figure | None:
    """Each run's final learned scale (mean over layers) against d_k, beside 1/√d_k: filled at
    its setting's best LR (the runs the exponent claims fit), faint at the other LRs, with the
    least-squares line of log s on log d_k through the filled points and its slope."""
    learned = [r for r in rows if r.get("final_learned_scale") not in (None, "")]
    if not learned:
        return None
    style = style or look.Style.of(rows)
    fig = Figure(figsize=(5.5 + look.LEGEND_INCHES, 4), layout="constrained")
    ax = fig.subplots()
    keys = look.Keys(style)
    best = {id(r) for r in _at_best_lr(learned)}
    for policy in dict.fromkeys(r["policy"] for r in learned):
        colour = style.colours[policy]
        mine = [r for r in learned if r["policy"] == policy]
        chosen = sorted((r["d_k"], r["final_learned_scale"]) for r in mine if id(r) in best)
        others = [(r["d_k"], r["final_learned_scale"]) for r in mine if id(r) not in best]
        if others:
            ax.plot(*zip(*others, strict=True), ".", color=colour, alpha=0.3)
        ax.plot(*zip(*chosen, strict=True), "o", color=colour, gid=policy, alpha=0.9)
        keys.series(policy, "", 1)
        if len({d for d, _ in chosen}) > 1:
            log_dk, log_s = np.log(np.array(chosen, dtype=float)).T  # (points, 2) -> 2 × (points,)
            slope, intercept, _ = exponent.ols(log_dk, log_s)
            ends = np.array([log_dk.min(), log_dk.max()])
            ax.plot(np.exp(ends), np.exp(intercept + slope * ends), "-", color=colour, lw=1)
            keys.mark(f"fit, {policy}: slope {slope:+.2f}", color=colour, linestyle="-")
    d_ks = sorted({r["d_k"] for r in rows})
    ax.plot(d_ks, [1 / math.sqrt(d) for d in d_ks], "k--")
    keys.mark("1/√d_k (slope −0.5)", color="k", linestyle="--")
    if len(best) < len(learned):
        keys.mark("faint: at other LRs", color="0.5", marker=".", linestyle="none")
    _log2_ticks(ax, d_ks)
    look.log_y(ax)
    ax.set_xlabel(DK_LABEL)
    ax.set_ylabel("final learned scale (mean over layers)")
    return look.finish(fig, [[ax]], {(0, 0)}, keys,
                       "one point per run, filled at\nits setting's best LR")


def _inv_sqrt_dk(ax, d_k: int, keys: look.Keys) -> None:
    ax.axhline(1 / math.sqrt(d_k), color="k", linestyle="--", linewidth=1)
    keys.mark("1/√d_k", color="k", linestyle="--")


def plot_learned_scale_over_training(runs: list[dict], rows: list[dict],
                                     style: look.Style | None = None) -> Figure | None:
    """The learned scale (mean over layers) over training against the dashed 1/√d_k line:
    where the scale heads, and whether it got there. None when no run has a learned scale."""
    chosen = [(run, row) for run, row in zip(runs, rows, strict=True)
              if row.get("final_learned_scale") is not None]
    if not chosen:
        return None
    runs, rows_learned = map(list, zip(*chosen, strict=True))
    return plot_over_training(runs, rows_learned, lambda r: rm.layer_mean(r, "learned_scale"),
                              "learned scale (mean over layers)", style=style or look.Style.of(rows),
                              log_y=True, extra=_inv_sqrt_dk)


def _dk_varies_in_a_series(rows: list[dict]) -> bool:
    """Whether some line of plot_final_vs_dk (a policy and second axis) spans several d_k: not
    where d_k is fixed, nor where it moves only with a field that has a panel of its own (the
    width, in mup_transfer)."""
    second_of, d_ks = groups.second_axis(rows), defaultdict(set)
    for r in rows:
        for second in second_of(r):
            d_ks[(r["policy"], second)].add(r["d_k"])
    return any(len(values) > 1 for values in d_ks.values())


def row_plots(rows: list[dict], style: look.Style) -> dict[str, Figure]:
    """The plots drawn from summary rows alone (summary.csv suffices)."""
    key, higher = cmp.primary_metric(rows)
    out = {}
    if _dk_varies_in_a_series(rows) or not cmp.has_lr_grid(rows):
        # Else every panel is a column of dots at one d_k: loss_vs_lr's minima again.
        out["final_bpb_vs_dk.png"] = plot_final_vs_dk(rows, style)
    if cmp.has_lr_grid(rows):
        metric = "recall accuracy" if higher else "validation bits per byte"
        out["loss_vs_lr.png"] = plot_against_lr(rows, key, f"final {metric}", style=style,
                                                unit="accuracy" if higher else "bpb")
        layers = sorted({k for r in rows for k in r if k.startswith("max_attention_logit/layer")})
        for layer_key in layers:  # Wortsman et al. 2023 Fig. 2: logit growth against LR
            layer = layer_key.rsplit("/", 1)[1]
            out[f"max_logit_vs_lr_{layer}.png"] = plot_against_lr(
                rows, layer_key, f"max |attention logit| over training, {layer}", unit=None,
                log_y=True, float16_line=True, style=style)
        for length_key in sorted({k for r in rows for k in r if k.startswith(DEGRADATION)}):
            length = length_key.rsplit("@", 1)[1]  # length_generalization: L = 2n, 4n
            out[f"degradation_vs_lr_{length}.png"] = plot_against_lr(
                rows, length_key, f"bits per byte beyond n\nminus at n, L = {length}",
                unit=None, zero_line=True, style=style)
    out["learned_scale_vs_dk.png"] = plot_learned_scale(rows, style)
    out.update(exponent_plots.figures(rows))  # loss against c, c* against d_k (dk_exponent)
    out.update(transfer_plots.figures(rows, style))  # best LR against width (mup_transfer)
    return {name: fig for name, fig in out.items() if fig is not None}


def training_plots(runs: list[dict], rows: list[dict], style: look.Style) -> dict[str, Figure]:
    """The plots over training, drawn from the runs' metrics rows."""
    _, higher = cmp.primary_metric(rows)
    value, ylabel = ((lambda r: r.get("val/accuracy"), "validation recall accuracy") if higher
                     else (_val_bpb, "validation bits per byte"))
    out = {
        "val_loss_curves.png": plot_over_training(
            runs, rows, value, ylabel, style=style, unit="accuracy" if higher else "bpb",
            zoom=not higher),
        "entropy_over_training.png": plot_over_training(
            runs, rows, lambda r: rm.layer_mean(r, "entropy_normalised"),
            "attention entropy / ln(keys),\nmean over layers", style=style),
        "max_logit_over_training.png": plot_over_training(
            runs, rows, lambda r: rm.layer_max(r, "max_abs_logit"),
            "max |attention logit|, max over layers", style=style, geometric=True, log_y=True,
            extra=lambda ax, d_k, keys: look.float16_max(ax, rows, keys)),
        "learned_scale_over_training.png": plot_learned_scale_over_training(runs, rows, style),
    }
    return {name: fig for name, fig in out.items() if fig is not None}


def build_plots(runs: list[dict], rows: list[dict]) -> dict[str, Figure]:
    """Every plot the runs support, by file name, in one style (colours by policy)."""
    style = look.Style.of(rows)
    return {**training_plots(runs, rows, style), **row_plots(rows, style)}


def write_plots(runs: list[dict], rows: list[dict], out: str) -> list[str]:
    """Every plot the runs support, written under `out`; returns the file names."""
    figures = build_plots(runs, rows)
    for name, fig in figures.items():
        look.save(fig, os.path.join(out, name))
    return list(figures)
