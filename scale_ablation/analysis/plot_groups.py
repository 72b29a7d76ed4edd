"""How a report's runs become plotted series and panels; nothing here draws.

A *series* is one line: a policy (its colour) and a *second axis* (its line style and marker):
the run's other overrides (init, init gain, norm position, dtype) and, for a d_k sweep that
varies the head count, the arm it belongs to. The head count itself is not a series key: in the
fixed-width arm it changes with d_k (d_model / d_k), so keyed on it every point would be a
series of one and lines would join unrelated cells.

Panels: one column per d_k. When a column would hold more than `MAX_SERIES` series, the figure
becomes small multiples with one row of panels per second-axis value, so no panel holds more
than the policies (Tufte's small multiples; the shipped sweeps have at most 8 policies). With a
single d_k those panels wrap into rows of `WRAP`, and each panel's title, which names its
second-axis value, is folded to the panel's width.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections import defaultdict
from collections.abc import Callable

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import intervals
from scale_ablation.records import metrics_rows as rm

MAX_SERIES = 8
_NOT_SECOND = (*cmp.TABLE_AXES, "train.lr", "model.num_heads")


def arms(rows: list[dict]) -> Callable[[dict], list[str]]:
    """row -> the d_k-sweep arms it belongs to, inferred from the rows alone (summary.csv has
    no d_model): the attention width num_heads × d_k shared by the most d_k values is the
    fixed-width arm; a head count that also appears at another width is a fixed-heads arm. A
    point with both (num_heads × d_k = d_model at the fixed head count) is in both. Rows
    without a swept head count: one arm, unnamed ("")."""
    heads = [(r["d_k"], int(r["override:model.num_heads"])) for r in rows
             if r.get("override:model.num_heads") not in (None, "")]
    if not heads:
        return lambda row: [""]
    dks_at_width: dict[int, set] = defaultdict(set)
    for d_k, h in heads:
        dks_at_width[h * d_k].add(d_k)
    width, dks = max(dks_at_width.items(), key=lambda item: (len(item[1]), item[0]))
    if len(dks) < 2:  # no fixed-width arm: the head count is one more setting
        return lambda row: [f"num_heads={row.get('override:model.num_heads')}"]
    fixed_heads = {h for d_k, h in heads if h * d_k != width}

    def of(row: dict) -> list[str]:
        if row.get("override:model.num_heads") in (None, ""):
            return [""]
        h = int(row["override:model.num_heads"])
        found = [f"width {width}"] if h * row["d_k"] == width else []
        return found + ([f"{h} head{'s' if h > 1 else ''}"] if h in fixed_heads else [])

    return of


def second_axis(rows: list[dict]) -> Callable[[dict], list[str]]:
    """row -> its second-axis labels ("init=gpt2, width 512"); more than one for a point that
    two arms share, [""] when the sweep has no second axis."""
    arm_of = arms(rows)

    def of(row: dict) -> list[str]:
        extras = [f"{key.split('.')[-1]}={value}" for name, value in row.items()
                  if name.startswith("override:") and value not in (None, "")
                  and (key := name.removeprefix("override:")) not in _NOT_SECOND]
        return [", ".join(part for part in (*extras, arm) if part) for arm in arm_of(row)]

    return of


WRAP = 4  # panels per row of a split figure with one column (one d_k, or final against d_k)
TITLE_CHARACTERS = 44  # a 9-point title line that fits one panel's width


@dataclasses.dataclass(frozen=True)
class Grid:
    """Panels: columns are d_k values (or one, None); rows are second-axis labels when split
    (else one, None). With one column, split panels wrap into rows of WRAP."""

    columns: tuple
    rows: tuple

    @property
    def wrapped(self) -> bool:
        return len(self.columns) == 1 and self.rows != (None,)

    @property
    def split(self) -> bool:
        """Whether each panel holds one second-axis value, which its title names."""
        return self.rows != (None,)

    @property
    def shape(self) -> tuple[int, int]:
        if self.wrapped:
            width = min(WRAP, len(self.rows))
            return -(-len(self.rows) // width), width
        return len(self.rows), len(self.columns)

    def index(self, second: str, d_k: int | None) -> tuple[int, int]:
        row = self.rows.index(second) if self.rows != (None,) else 0
        if self.wrapped:
            return divmod(row, self.shape[1])
        return row, (self.columns.index(d_k) if self.columns != (None,) else 0)

    def second(self, i: int, j: int) -> str | None:
        return self.rows[i * self.shape[1] + j] if self.wrapped else self.rows[i]

    def d_k(self, j: int) -> int | None:
        return self.columns[0] if self.wrapped else self.columns[j]

    def title(self, i: int, j: int) -> str:
        d_k, second = self.d_k(j), self.second(i, j)
        parts = [] if d_k is None else [f"d_k = {d_k}"]
        title = ", ".join(parts + ([] if second in (None, "") else [second]))
        return textwrap.fill(title, TITLE_CHARACTERS, break_long_words=False)


def grid(keys: list[tuple[str, str, int | None]], by_dk: bool = True) -> Grid:
    """The panels for series `keys` (policy, second, d_k): a column per d_k (`by_dk`), split
    into a row per second-axis value when a column would hold more than MAX_SERIES series."""
    seconds = tuple(dict.fromkeys(second for _, second, _ in keys))
    per_column: dict = defaultdict(set)
    for policy, second, d_k in keys:
        per_column[d_k if by_dk else None].add((policy, second))
    split = len(seconds) > 1 and max(map(len, per_column.values()), default=0) > MAX_SERIES
    columns = tuple(sorted({d_k for *_, d_k in keys})) if by_dk else (None,)
    return Grid(columns, seconds if split else (None,))


def drop_repeats(series: dict, grid: Grid, names_of: Callable) -> dict:
    """Without small multiples, a cell two arms share (the same runs under two second-axis
    labels) is drawn once, under its first label; with them, once in each arm's row."""
    if grid.rows != (None,):
        return series
    seen, out = set(), {}
    for (policy, second, d_k), members in series.items():
        if (policy, d_k, names_of(members)) not in seen:
            seen.add((policy, d_k, names_of(members)))
            out[(policy, second, d_k)] = members
    return out


def _longest_lasting(runs: tuple[dict, ...] | list[dict]) -> float:
    """The LR whose runs lasted longest before diverging (every LR of the setting diverged)."""
    by_lr: dict = defaultdict(list)
    for r in runs:
        by_lr[r["lr"]].append(r.get("diverged_at_step") or r.get("steps_completed") or 0)
    return max(by_lr, key=lambda lr: min(by_lr[lr]))


def chosen_runs(runs: list[dict], rows: list[dict]) -> dict[tuple[str, str, int], list]:
    """(policy, second, d_k) -> [(run, row)] drawn over training: each setting at its own best
    LR when the sweep has an LR grid (the LR summary.md's "Best LR" table names; where every LR
    diverged, the one that lasted longest, so the line shows where it ended), else all."""
    at_best = {}
    if cmp.has_lr_grid(rows):
        key, higher = cmp.primary_metric(rows)
        curves = cmp.curves(rows)
        at_best = {(b.setting, b.d_k): b.lr if b.lr is not None else _longest_lasting(
            [r for by_lr in [curves[(b.setting, b.d_k)]] for rs in by_lr.values() for r in rs])
            for b in cmp.best_lrs(rows, key, higher)}
    second_of = second_axis(rows)
    out: dict = defaultdict(list)
    for run, row in zip(runs, rows, strict=True):
        best = at_best.get((cmp.setting(row), row["d_k"]), "all")
        if best == "all" or row["lr"] == best:
            for second in second_of(row):
                out[(row["policy"], second, row["d_k"])].append((run, row))
    return out


@dataclasses.dataclass(frozen=True)
class Point:
    """A series' value at one x: the centre, its 95% CI (low == high == centre when n < 2)."""

    x: float
    centre: float
    low: float
    high: float
    n: int


def summarise(values: list[float], geometric: bool = False) -> tuple[float, float, float]:
    """(centre, low, high): the mean with its 95% t-interval; `geometric`: of log values,
    back-transformed (the geometric mean; for max logits, which spread over decades)."""
    if geometric:
        centre, low, high = summarise([math.log(v) for v in values])
        return math.exp(centre), math.exp(low), math.exp(high)
    found = intervals.mean_ci(values)
    half = found.half_width or 0.0
    return found.mean, found.mean - half, found.mean + half


def over_training(runs: list[dict], value_of: Callable[[dict], float | None],
                  geometric: bool = False) -> list[Point]:
    """The runs' mean (or geometric mean) per step, at steps where every run logged a finite
    (for `geometric`, positive) value."""
    by_step: dict = defaultdict(list)
    for run in runs:
        for step, value in rm.series(run["metrics"], value_of):
            if math.isfinite(value) and (value > 0 or not geometric):
                by_step[step].append(value)
    return [Point(step, *summarise(values, geometric), len(values))
            for step, values in sorted(by_step.items()) if len(values) == len(runs)]
