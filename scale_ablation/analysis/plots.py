"""The report's plots: means over seeds with 95% CI error bars or bands, never per-seed lines.

Colour tells the policy apart, line style (and marker) the other swept fields; with an LR grid,
curves over training show each setting at its own best LR. Count baselines are drawn as grey
horizontal lines (MQAR: chance and context guessing). On loss-against-LR plots a diverged LR is
an `x` on the top edge, and LRs with a spiked or collapsed run carry a `^` or `v`.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict

from matplotlib import colormaps
from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import stats
from scale_ablation.records import metrics_rows as rm

LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "D", "P", "*", "h")
LN2 = math.log(2)


def _styles(rows: list[dict], name_of) -> dict[str, dict]:
    """Plot kwargs per group name: colour by policy, line style and marker by the rest."""
    names = list(dict.fromkeys(name_of(r) for r in rows))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    policy_of = {name_of(r): r["policy"] for r in rows}
    rest = list(dict.fromkeys(name.removeprefix(policy_of[name]) for name in names))
    return {name: {"color": f"C{policies.index(policy_of[name]) % 10}",
                   "linestyle": LINESTYLES[rest.index(name.removeprefix(policy_of[name])) % 4],
                   "marker": MARKERS[rest.index(name.removeprefix(policy_of[name])) % 6]}
            for name in names}


def _baselines(ax, rows: list[dict], unit: str) -> None:
    """Grey lines at the count baselines, in `unit`: bpb, nats or accuracy."""
    keys = {"bpb": (("baseline_unigram_bpb", "unigram", 1.0), ("baseline_bigram_bpb", "bigram", 1.0)),
            "nats": (("baseline_unigram_bpb", "unigram", LN2), ("baseline_bigram_bpb", "bigram", LN2)),
            "accuracy": (("baseline_chance_accuracy", "chance", 1.0),
                         ("baseline_context_guess_accuracy", "context guess", 1.0))}[unit]
    for (field, name, factor), style in zip(keys, (":", "-."), strict=True):
        values = {r[field] for r in rows if r.get(field) is not None}
        for value in values:
            ax.axhline(value * factor, color="0.4", linestyle=style, linewidth=1,
                       label=f"{name} {value * factor:.3f}")


def _mean_series(runs: list[dict], key_fn) -> list[tuple[int, float, float]]:
    """(step, mean, CI half-width or 0) over the runs' series, at steps every run logged."""
    by_step = defaultdict(list)
    for run in runs:
        for step, value in rm.series(run["metrics"], key_fn):
            if math.isfinite(value):
                by_step[step].append(value)
    out = []
    for step in sorted(by_step):
        if len(by_step[step]) == len(runs):
            found = stats.mean_ci(by_step[step])
            out.append((step, found.mean, found.half_width or 0.0))
    return out


def _training_groups(runs: list[dict], rows: list[dict]) -> dict[tuple[str, int], list]:
    """(label, d_k) -> [(run, row)] of the runs to draw over training: each setting at its best
    LR when the sweep has an LR grid, else each variant."""
    key, higher = cmp.primary_metric(rows)
    at_best = {}
    if cmp.has_lr_grid(rows):
        at_best = {(b.setting, b.d_k): b.lr for b in cmp.best_lrs(rows, key, higher)}
    groups = defaultdict(list)
    for run, row in zip(runs, rows, strict=True):
        best = at_best.get((cmp.setting(row), row["d_k"]), "none")
        if best == "none":
            groups[(cmp.variant(row), row["d_k"])].append((run, row))
        elif row["lr"] == best:
            groups[(f"{cmp.setting(row)} @ lr={best:.3g}", row["d_k"])].append((run, row))
    return groups


def _legend(ax, *, loc: str, fontsize: float = 6) -> None:
    """A legend inside the panel, when it has labelled lines."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc=loc)


def _panels(count: int, rows_of_panels: int = 1, width: float = 4.5, height: float = 3.6):
    fig = Figure(figsize=(width * count, height * rows_of_panels))
    return fig, fig.subplots(rows_of_panels, count, squeeze=False)


def plot_curves(runs: list[dict], rows: list[dict], key_fn, ylabel: str, path: str, *,
                unit: str | None = None, zoom: bool = False) -> None:
    """One panel per d_k; mean over seeds with a 95% CI band. `zoom`: the y-range covers the
    second half of training, where the final gaps are."""
    head_dims = sorted({r["d_k"] for r in rows})
    fig, axes = _panels(len(head_dims))
    groups = _training_groups(runs, rows)
    styles = _styles([{**row, "label": label} for (label, _), members in groups.items()
                      for _, row in members], lambda r: r["label"])
    for (label, d_k), members in groups.items():
        ax = axes[0][head_dims.index(d_k)]
        points = _mean_series([run for run, _ in members], key_fn)
        if not points:
            continue
        steps, means, halves = zip(*points, strict=True)
        style = styles[label]
        ax.plot(steps, means, color=style["color"], linestyle=style["linestyle"], label=label)
        ax.fill_between(steps, [m - h for m, h in zip(means, halves, strict=True)],
                        [m + h for m, h in zip(means, halves, strict=True)],
                        color=style["color"], alpha=0.2)
    for ax, d_k in zip(axes[0], head_dims, strict=True):
        if zoom:
            _zoom(ax)
        if unit:
            _baselines(ax, [r for r in rows if r["d_k"] == d_k], unit)
            if zoom:  # keep the best count baseline (bigram) in view: the model must beat it
                _include_bigram(ax, [r for r in rows if r["d_k"] == d_k], unit)
        ax.set_title(f"d_k = {d_k}")
        ax.set_xlabel("step")
        _legend(ax, loc="upper right")
    _save(fig, axes, ylabel, path)


def _save(fig, axes, ylabel: str, path: str) -> None:
    """A row of panels out to PNG, the y label on the first."""
    axes[0][0].set_ylabel(ylabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _zoom(ax) -> None:
    """Limit y to the lines' values over the second half of their steps (bands included)."""
    values = []
    for line in ax.get_lines():
        steps, ys = line.get_xdata(), line.get_ydata()
        if len(steps):
            half = steps[-1] / 2
            values += [y for s, y in zip(steps, ys, strict=True) if s >= half]
    if values:
        low, high = min(values), max(values)
        pad = 0.15 * (high - low) or 0.05 * abs(high) or 0.1
        ax.set_ylim(low - pad, high + pad)


def _include_bigram(ax, rows: list[dict], unit: str) -> None:
    factor = {"bpb": 1.0, "nats": LN2}.get(unit)
    values = [r["baseline_bigram_bpb"] * factor for r in rows
              if factor and r.get("baseline_bigram_bpb") is not None]
    if values:
        low, high = ax.get_ylim()
        ax.set_ylim(min(low, min(values) - 0.05 * (high - low)), max(high, max(values)))


def plot_final_vs_dk(rows: list[dict], path: str) -> None:
    key, higher = cmp.primary_metric(rows)
    fig, axes = _panels(1, width=6, height=4.2)
    ax = axes[0][0]
    if cmp.has_lr_grid(rows):  # each setting at its own best LR
        best = {(b.setting, b.d_k): b for b in cmp.best_lrs(rows, key, higher)}
        name_of, chosen = cmp.setting, [r for r in rows
                                        if (b := best.get((cmp.setting(r), r["d_k"])))
                                        and r["lr"] == b.lr]
    else:
        name_of, chosen = cmp.variant, rows
    styles = _styles(rows, name_of)
    for name in dict.fromkeys(name_of(r) for r in rows):
        members = [r for r in chosen if name_of(r) == name]
        points = [(d, e) for d in sorted({r["d_k"] for r in members})
                  if (e := cmp.estimate([r for r in members if r["d_k"] == d], key))]
        if points:
            ax.errorbar([d for d, _ in points], [e.mean for _, e in points],
                        yerr=[e.half_width or 0 for _, e in points], capsize=3,
                        label=name, **styles[name])
        diverged = [r["d_k"] for r in rows if name_of(r) == name and r["status"] == "diverged"]
        if diverged:
            ax.plot(diverged, [1.0] * len(diverged), "x", color=styles[name]["color"],
                    transform=ax.get_xaxis_transform(), clip_on=False)
    _baselines(ax, rows, "accuracy" if higher else "bpb")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("d_k (head_dim)")
    best_note = " at its best LR" if cmp.has_lr_grid(rows) else ""
    ax.set_ylabel(f"final {key.removeprefix('final_')}{best_note}\n(mean ± 95% CI; x: diverged)")
    _legend(ax, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_against_lr(rows: list[dict], key: str, ylabel: str, path: str, *,
                    unit: str | None, log_y: bool = False, float16_line: bool = False) -> None:
    """Final `key` against the learning rate: one panel per d_k, one line per setting with 95%
    CI error bars; diverged (x, top edge), spiked (^) and collapsed (v) LRs marked.
    `float16_line`: mark float16's maximum (`mark_float16_max`), for logit plots."""
    head_dims = sorted({r["d_k"] for r in rows})
    fig, axes = _panels(len(head_dims))
    styles = _styles(rows, cmp.setting)
    plotted = set()
    # A log axis shows the geometric mean and the CI of the mean log10, back-transformed.
    scale = (lambda v: 10**v) if log_y else (lambda v: v)
    for (name, d_k), by_lr in cmp.curves(cmp.log10_rows(rows, key) if log_y else rows).items():
        ax = axes[0][head_dims.index(d_k)]
        style = styles[name]
        points = [(lr, e) for lr in sorted(by_lr) if (e := cmp.estimate(by_lr[lr], key))]
        if points:
            plotted.add(d_k)
            centre = [scale(e.mean) for _, e in points]
            low = [c - scale(e.mean - (e.half_width or 0)) for c, (_, e) in zip(centre, points, strict=True)]
            high = [scale(e.mean + (e.half_width or 0)) - c for c, (_, e) in zip(centre, points, strict=True)]
            ax.errorbar([lr for lr, _ in points], centre, yerr=[low, high], capsize=3,
                        label=name, **style)
        _mark_unstable(ax, by_lr, {lr: c for (lr, _), c in zip(points, centre, strict=True)}
                       if points else {}, style["color"])
    for ax, d_k in zip(axes[0], head_dims, strict=True):
        if unit:
            _baselines(ax, [r for r in rows if r["d_k"] == d_k], unit)
        ax.set_xscale("log")
        if log_y and d_k in plotted:
            ax.set_yscale("log")
        if float16_line:
            mark_float16_max([ax], [r for r in rows if r["d_k"] == d_k])
        ax.set_title(f"d_k = {d_k}")
        ax.set_xlabel("learning rate")
        _legend(ax, loc="best")
    _save(fig, axes, ylabel, path)


def _mark_unstable(ax, by_lr: dict[float, list[dict]], means: dict[float, float],
                   colour: str) -> None:
    for lr, runs in by_lr.items():
        if any(r["status"] == "diverged" for r in runs):
            ax.plot([lr], [1.0], "x", color=colour, markersize=9,
                    transform=ax.get_xaxis_transform(), clip_on=False)
        if lr not in means:
            continue
        if any(r.get("spike_step") is not None for r in runs):
            ax.plot([lr], [means[lr]], "^", color=colour, markersize=11, fillstyle="none")
        if any(r.get("collapse_step") is not None for r in runs):
            ax.plot([lr], [means[lr]], "v", color=colour, markersize=11, fillstyle="none")


def plot_logits_over_training(runs: list[dict], rows: list[dict], path: str) -> bool:
    """Max |attention logit| per layer over training (Wortsman et al. 2023 Fig. 1): one panel
    per (setting, d_k) and layer, one line per learning rate (mean over seeds)."""
    layers = sorted({int(k.rsplit("layer", 1)[1]) for r in rows for k in r
                     if k.startswith("max_attention_logit/layer")})
    if not layers:
        return False
    groups = defaultdict(lambda: defaultdict(list))
    for run, row in zip(runs, rows, strict=True):
        groups[(cmp.setting(row), row["d_k"])][row["lr"]].append(run)
    lrs = sorted({r["lr"] for r in rows})
    colours = colormaps["viridis"]
    fig, axes = _panels(len(layers), len(groups), width=4, height=2.8)
    for i, ((name, d_k), by_lr) in enumerate(groups.items()):
        for j, layer in enumerate(layers):
            ax = axes[i][j]
            stat = lambda row, layer=layer: row.get(f"attn/layer{layer}/max_abs_logit")  # noqa: E731
            for lr, members in sorted(by_lr.items()):
                points = _mean_series(members, stat)
                if points:
                    shade = colours(lrs.index(lr) / max(len(lrs) - 1, 1))
                    ax.plot([p[0] for p in points], [p[1] for p in points], color=shade,
                            label=f"lr {lr:.3g}")
            if ax.has_data():
                ax.set_yscale("log")
                mark_float16_max([ax], rows)
            ax.set_title(f"{name}, d_k={d_k}, layer {layer}", fontsize=8)
            _legend(ax, loc="upper left", fontsize=5)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for row_axes in axes:
        row_axes[0].set_ylabel("max |attention logit|")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def plot_learned_scale(rows: list[dict], path: str) -> bool:
    learned = [r for r in rows if r["final_learned_scale"] is not None]
    if not learned:
        return False
    fig, axes = _panels(1, width=5.5, height=4)
    ax = axes[0][0]
    for i, policy in enumerate(dict.fromkeys(r["policy"] for r in learned)):
        points = sorted((r["d_k"], r["final_learned_scale"]) for r in learned
                        if r["policy"] == policy)
        ax.plot(*zip(*points, strict=True), "o", color=f"C{i}", label=f"{policy} (final)")
    head_dims = sorted({r["d_k"] for r in rows})
    ax.plot(head_dims, [1 / math.sqrt(d) for d in head_dims], "k--", label="1/√d_k")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("d_k")
    ax.set_ylabel("learned scale (mean over layers)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def plot_learned_scale_over_training(runs: list[dict], rows: list[dict], path: str) -> bool:
    """The learned scale (mean over layers) over training, one panel per d_k, one line per
    setting (at its best LR with an LR grid; mean over seeds with a 95% CI band), against the
    dashed 1/√d_k line: where the scale heads, and whether it got there, not just where it
    ended. False (nothing drawn) when no run has a learned scale."""
    chosen = [(run, row) for run, row in zip(runs, rows, strict=True)
              if row.get("final_learned_scale") is not None]
    if not chosen:
        return False
    head_dims = sorted({row["d_k"] for _, row in chosen})
    fig, axes = _panels(len(head_dims))
    groups = _training_groups(*map(list, zip(*chosen, strict=True)))
    styles = _styles([{**row, "label": label} for (label, _), members in groups.items()
                      for _, row in members], lambda r: r["label"])
    for (label, d_k), members in groups.items():
        points = _mean_series([run for run, _ in members],
                              lambda r: rm.layer_mean(r, "learned_scale"))
        if not points:
            continue
        ax, style = axes[0][head_dims.index(d_k)], styles[label]
        steps, means, halves = zip(*points, strict=True)
        ax.plot(steps, means, color=style["color"], linestyle=style["linestyle"], label=label)
        ax.fill_between(steps, [m - h for m, h in zip(means, halves, strict=True)],
                        [m + h for m, h in zip(means, halves, strict=True)],
                        color=style["color"], alpha=0.2)
    for ax, d_k in zip(axes[0], head_dims, strict=True):
        ax.axhline(1 / math.sqrt(d_k), color="k", linestyle="--", linewidth=1,
                   label=f"1/√d_k = {1 / math.sqrt(d_k):.3g}")
        ax.set_yscale("log")
        ax.set_title(f"d_k = {d_k}")
        ax.set_xlabel("step")
        _legend(ax, loc="upper right")
    _save(fig, axes, "learned scale (mean over layers)", path)
    return True


FLOAT16_MAX = 65504.0  # the largest finite float16: a logit above it overflows to inf


def mark_float16_max(axes, rows: list[dict]) -> None:
    """A red line at float16's largest value on max-logit axes, when the sweep has float16
    runs (`train.dtype`), so the reader sees which runs' logits could not be held in float16."""
    if not any(str(r.get("override:train.dtype")) == "float16" for r in rows):
        return
    for ax in axes:
        ax.axhline(FLOAT16_MAX, color="red", linestyle=":", linewidth=1,
                   label="float16 max 65504")


def write_plots(runs: list[dict], rows: list[dict], out: str) -> list[str]:
    """Every plot the runs support, written under `out`; returns the file names."""
    key, higher = cmp.primary_metric(rows)
    path = lambda name: os.path.join(out, name)  # noqa: E731
    plot_curves(runs, rows, lambda r: r.get("val/loss"), "validation loss (nats/byte)",
                path("val_loss_curves.png"), unit="nats" if not higher else None, zoom=True)
    plot_curves(runs, rows, lambda r: rm.layer_mean(r, "entropy_normalised"),
                "attention entropy / ln(keys)", path("entropy_over_training.png"))
    plot_final_vs_dk(rows, path("final_bpb_vs_dk.png"))
    written = ["val_loss_curves.png", "entropy_over_training.png", "final_bpb_vs_dk.png"]
    if cmp.has_lr_grid(rows):
        plot_against_lr(rows, key, f"final {key.removeprefix('final_')} (mean ± 95% CI)",
                        path("loss_vs_lr.png"), unit="accuracy" if higher else "bpb")
        layers = sorted({k for r in rows for k in r if k.startswith("max_attention_logit/layer")})
        for layer_key in layers:  # Wortsman et al. 2023 Fig. 2: logit growth against LR
            name = f"max_logit_vs_lr_{layer_key.rsplit('/', 1)[1]}.png"
            plot_against_lr(rows, layer_key, f"max |attention logit|, {layer_key.rsplit('/', 1)[1]}",
                            path(name), unit=None, log_y=True, float16_line=True)
            written.append(name)
        written.append("loss_vs_lr.png")
    if plot_logits_over_training(runs, rows, path("max_logit_over_training.png")):
        written.append("max_logit_over_training.png")
    if plot_learned_scale(rows, path("learned_scale_vs_dk.png")):
        written.append("learned_scale_vs_dk.png")
    if plot_learned_scale_over_training(runs, rows, path("learned_scale_over_training.png")):
        written.append("learned_scale_over_training.png")
    return written
