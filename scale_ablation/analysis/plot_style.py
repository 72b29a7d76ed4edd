"""How the report's plots look, so that every plot of a report reads the same way.

- One colour per policy (tab10: the reference policy first, then the rows' first-seen order),
  the same in every plot of a report: `Style.of(rows)` is built once from all the rows and passed to every plot.
- Line style and marker per second-axis value (init, arm; `plot_groups.second_axis`).
- Panels on a grid with one legend per figure, outside every panel (constrained layout's
  "outside" legend), and the sample size said in the legend's title: bands and error bars only
  where n >= 2.
- A size cap: a figure larger than MAX_PIXELS is saved at a lower dpi.
- Count baselines (unigram, bigram; MQAR chance and context guessing) as grey lines, or, when
  off the axis, named at its top or bottom edge with their value.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap

from matplotlib import colormaps
from matplotlib.colors import to_hex
from matplotlib.figure import Figure  # no pyplot: no global state, no display backend
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatterSciNotation

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import plot_groups

LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
PANEL_INCHES = (3.4, 2.6)
LEGEND_INCHES = 2.4  # room for the legend right of the panels
LEGEND_ENTRY_INCHES = 0.19  # height of one legend line at fontsize 8
DPI = 100
MAX_PIXELS = (2400, 2400)  # (width, height) of any saved image
GREY = "0.4"
FLOAT16_MAX = 65504.0  # the largest finite float16: a logit above it overflows to inf
BASELINES = {"bpb": (("baseline_unigram_bpb", "unigram"), ("baseline_bigram_bpb", "bigram")),
             "accuracy": (("baseline_chance_accuracy", "chance"),
                          ("baseline_context_guess_accuracy", "context guess"))}


@dataclasses.dataclass(frozen=True)
class Style:
    colours: dict[str, str]  # policy -> colour
    seconds: dict[str, tuple[str, str]]  # second-axis label -> (line style, marker)

    @classmethod
    def of(cls, rows: list[dict]) -> Style:
        # The reference policy first, so that 1/√d_k is the same blue in every report.
        policies = sorted(dict.fromkeys(r["policy"] for r in rows),
                          key=lambda p: p != cmp.DEFAULT_REFERENCE)
        palette = colormaps["tab10" if len(policies) <= 10 else "tab20"].colors
        second_of = plot_groups.second_axis(rows)
        seconds = list(dict.fromkeys(label for r in rows for label in second_of(r)))
        return cls({p: to_hex(palette[i % len(palette)]) for i, p in enumerate(policies)},
                   {s: (LINESTYLES[i % len(LINESTYLES)], MARKERS[i % len(MARKERS)])
                    for i, s in enumerate(seconds)})

    def line(self, policy: str, second: str) -> dict:
        linestyle, marker = self.seconds.get(second, ("-", "o"))
        return {"color": self.colours.get(policy, "k"), "linestyle": linestyle, "marker": marker}


def unset_label(seconds) -> str:
    """The legend's name for the series without a second-axis value: the fields the other series
    set, at their defaults ("z_loss at default"), rather than a bare "(other)"."""
    fields = dict.fromkeys(part.split("=")[0] for second in seconds if second
                           for part in second.split(", ") if "=" in part)
    return f"{', '.join(fields)} at default" if fields else "(other)"


class Keys:
    """The entries of a figure's one legend: the policies drawn (colour), the second-axis
    values drawn (style), then marks (baselines, diverged, ...), each once."""

    def __init__(self, style: Style) -> None:
        self.style = style
        self.policies: dict[str, None] = {}
        self.seconds: dict[str, None] = {}
        self.marks: dict[str, Line2D] = {}
        self.sizes: set[int] = set()

    def series(self, policy: str, second: str, n: int) -> None:
        self.policies[policy] = None
        self.seconds[second] = None
        self.sizes.add(n)

    def mark(self, label: str, **line: object) -> None:
        self.marks.setdefault(label, Line2D([], [], **line))

    def handles(self, seconds: bool = True) -> tuple[list, list[str]]:
        """Legend entries; `seconds`: with the second-axis styles (False when each panel's
        title names its one second-axis value: long labels would crowd the figure)."""
        policies = sorted(self.policies, key=list(self.style.colours).index)  # palette order
        handles = [Line2D([], [], color=self.style.colours[p], linewidth=2.5) for p in policies]
        labels = list(policies)
        if seconds and len(self.style.seconds) > 1:  # a second axis the report has: its styles
            for second in self.seconds:
                linestyle, marker = self.style.seconds.get(second, ("-", "o"))
                handles.append(Line2D([], [], color="0.2", linestyle=linestyle, marker=marker))
                labels.append(second or unset_label(self.seconds))
        return handles + list(self.marks.values()), labels + list(self.marks)

    def title(self, what: str = "mean over seeds", band: str = "95% CI") -> str:
        """The sample size, said: n per point, and where intervals are drawn."""
        low, high = min(self.sizes, default=1), max(self.sizes, default=1)
        size = f"n = {low}" if low == high else f"n = {low}–{high}"
        if high < 2:
            return f"{what} ({size}): no {band}"
        return f"{what} ({size})\n{band} where n ≥ 2"


def panels(grid: plot_groups.Grid, *, sharey: bool = False) -> tuple[Figure, list[list]]:
    """A figure of the grid's panels, room for the legend on the right; `sharey`: one y scale
    for all panels, so that they compare at a glance."""
    rows, columns = grid.shape
    fig = Figure(figsize=(PANEL_INCHES[0] * columns + LEGEND_INCHES, PANEL_INCHES[1] * rows),
                 layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False, sharey=sharey)
    return fig, [list(row) for row in axes]


def finish(fig: Figure, axes: list[list], used: set[tuple[int, int]], keys: Keys,
           title: str, grid: plot_groups.Grid | None = None) -> Figure:
    """Hide the panels nothing was drawn in, add the one legend outside them (without the
    second-axis styles when the `grid` is split: the panel titles name them), and set the dpi
    that keeps the image within MAX_PIXELS."""
    for i, row in enumerate(axes):
        for j, ax in enumerate(row):
            ax.set_visible((i, j) in used)
    handles, labels = keys.handles(seconds=grid is None or not grid.split)
    if handles:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, title=title,
                   title_fontsize=8, frameon=False)
        # Tall enough for the legend: a legend taller than the figure is cut off at its foot.
        needed = LEGEND_ENTRY_INCHES * (len(labels) + title.count("\n") + 1) + 0.3
        width, height = fig.get_size_inches()
        fig.set_size_inches(width, max(height, needed))
    width, height = fig.get_size_inches()
    fig.set_dpi(min(DPI, MAX_PIXELS[0] / width, MAX_PIXELS[1] / height))
    return fig


def save(fig: Figure, path: str) -> None:
    fig.savefig(path, dpi="figure")


def axis_labels(axes: list[list], used: set[tuple[int, int]], xlabel: str, ylabel: str) -> None:
    """x label under the lowest used panel of each column; one y label for the figure (a
    label per row of panels would run into the next row)."""
    for j in range(len(axes[0])):
        lowest = max((i for i, jj in used if jj == j), default=None)
        if lowest is not None:
            axes[lowest][j].set_xlabel(xlabel)
    rows = len(axes)
    width = 28 if rows == 1 else 60  # characters a label fits beside one or more panel rows
    axes[0][0].figure.supylabel(textwrap.fill(ylabel, width), fontsize=10 if rows > 1 else 9)


def log_y(ax, centres: list[float] | None = None) -> None:
    """A log y axis labelled at its decades, and at a few minor ticks (2, 3, 5 …) only where
    it spans under one decade, which may hold one decade label or none (every minor label
    would crowd a small panel). With `centres`, the range is theirs widened by half a decade:
    an interval of two seeds can span many decades and would flatten every line; its bar runs
    off the panel instead."""
    ax.set_yscale("log")
    # Decided at draw time, from the final limits: no minor labels over one decade, a subset
    # of them from 1 down to 0.1 decade, all below.
    ax.yaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False,
                                                         minor_thresholds=(1.0, 0.1)))
    if centres:
        ax.set_ylim(min(centres) / 3, max(centres) * 3)


def lr_ticks(ax, lrs: list[float]) -> None:
    """A log LR axis ticked at the grid's learning rates, labelled where a label has room: a
    refined grid packs ×√2 points near its optimum, whose labels would overlap."""
    ax.set_xscale("log")
    span = math.log10(max(lrs) / min(lrs)) if len(lrs) > 1 else 0.0
    gap = span / 5  # decades between labels: about five labels fit a small panel
    labels, last = [], -math.inf
    for lr in lrs:
        room = math.log10(lr) - last >= gap
        labels.append(f"{lr:.2g}" if room else "")
        last = math.log10(lr) if room else last
    ax.set_xticks(lrs, labels, fontsize=7)
    ax.minorticks_off()


def baselines(ax, rows: list[dict], unit: str, keys: Keys, corner: str = "right") -> None:
    """The count baselines of `unit` ("bpb" or "accuracy") in `rows`: a grey line when within
    the axis' current y-range, else its name and value at the edge it lies beyond, in the
    `corner` ("left", "right") where the plot's marks (diverged x at high d_k or LR) are not."""
    low, high = sorted(ax.get_ylim())
    edge = {"above": 0, "below": 0}
    for (field, name), linestyle in zip(BASELINES[unit], (":", "-."), strict=True):
        for value in sorted({r[field] for r in rows if r.get(field) not in (None, "")}):
            if low <= value <= high:
                ax.axhline(value, color=GREY, linestyle=linestyle, linewidth=1)
                keys.mark(f"{name} (count baseline)", color=GREY, linestyle=linestyle)
                continue
            side = "above" if value > high else "below"
            ax.annotate(f"{name} {value:.3g} {'↑' if side == 'above' else '↓'}",
                        xy=(corner == "right", 1 if side == "above" else 0),
                        xycoords="axes fraction",
                        xytext=(-3 if corner == "right" else 3,
                                (-3 - 9 * edge[side]) if side == "above" else (3 + 9 * edge[side])),
                        textcoords="offset points", ha=corner,
                        va="top" if side == "above" else "bottom", fontsize=7, color=GREY,
                        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})
            edge[side] += 1


def float16_max(ax, rows: list[dict], keys: Keys) -> None:
    """A red line at float16's largest value on max-logit axes, when the sweep has float16
    runs (`train.dtype`), so the reader sees which runs' logits could not be held in float16."""
    if any(str(r.get("override:train.dtype")) == "float16" for r in rows):
        ax.axhline(FLOAT16_MAX, color="red", linestyle=":", linewidth=1)
        keys.mark("float16 max 65504", color="red", linestyle=":")


def no_degradation(ax, keys: Keys) -> None:
    """The zero line on degradation axes (bits per byte beyond n minus at n): the count
    baselines are of a loss, not of a difference, so a policy's reference there is 0."""
    ax.axhline(0.0, color=GREY, linestyle="--", linewidth=1)
    keys.mark("no degradation (0)", color=GREY, linestyle="--")
