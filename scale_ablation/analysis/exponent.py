"""The optimal attention scale's exponent in d_k, from a sweep of c·d_k^(-1/2) over c
(experiments/dk_exponent.py): per init and d_k the best c, then log c* against log d_k.

If the best scale is ∝ d_k^α, then c* = scale·√d_k ∝ d_k^(α + 1/2): the slope of log c* on
log d_k is α + 1/2. α = −1/2 (1/√d_k, the article) gives slope 0; α = −1 (1/d_k, μP) slope −1/2;
α = 0 (no divisor) slope +1/2.

Rules, stated once:

- **Each c at its best LR.** For each (init, d_k, c) the learning rate of lowest mean validation
  metric over seeds (`optimum.fit_optimum`'s best grid point: the runs exist there, not at the
  fitted vertex); every seed's value at that LR is the c's point. An LR at which any seed has no
  finite value ranks below every finished one (optimum.py's rule). The LR is chosen once on all
  seeds and kept in the bootstrap (the LR choice's own noise is not resampled).
- **c* per d_k** is `optimum.fit_optimum` over log c (the parabola's vertex through the best c
  and its neighbours), with its percentile bootstrap CI over seeds. A best c on the grid's edge
  is a bound, not a location: the fit is then not established (the verdict inconclusive) and
  `optimum.refine_points` says which c to run next. So is a best c whose own LR, or a
  neighbour's, sat on its LR grid's edge (a wider LR grid could move that point of the curve).
- **The slope** is the ordinary least-squares slope of log c* on log d_k over the d_k whose c*
  is interior. Two 95% intervals: a percentile bootstrap over seeds (each d_k's seeds resampled
  independently, c* refitted, the slope refitted: the seeds' noise) and the regression's
  Student-t interval on n − 2 degrees of freedom (the scatter of the c* about the line, which
  also holds the ×2 grid's discretisation and any bend). The decision uses their union, so that
  neither source is ignored. With fewer than three d_k there is no t interval, and fewer than
  two seeds leave no bootstrap: no decision.
- **α = slope − 1/2**, its interval the slope's shifted.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import intervals, optimum
from scale_ablation.analysis.claims import Verdict
from scale_ablation.model import scale_family

INIT = "override:model.init"
DEFAULT_INIT = "fan_in"  # experiments/base.py's model.init
N_BOOT = 1000
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class CCurve:
    """One (init, d_k): the metric against c, each c at its own best learning rate."""

    cs: tuple[float, ...]  # ascending
    best_lrs: tuple[float, ...]  # per c
    lr_edges: tuple[bool, ...]  # per c: its best LR on its LR grid's edge
    losses_by_seed: dict[int, list[float | None]]  # seed -> per c, at that c's best LR


def init_of(row: dict) -> str:
    return str(row.get(INIT) or DEFAULT_INIT)


def _grid(rows: list[dict], key: str) -> dict:
    """d_k -> c -> lr -> seed -> value, over the rows of the c·d_k^(-1/2) family."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(dict)))
    for r in rows:
        c = scale_family.multiplier(r["policy"])
        if c is not None:
            out[int(r["d_k"])][c][float(r["lr"])][r["seed"]] = cmp.finished_value(r, key)
    return out


def _at_best_lr(by_lr: dict, seeds: list) -> tuple[float, bool, list[float | None]] | None:
    """(best LR, at its grid's edge, each seed's value there) of one c, or None when no LR has
    every seed run or none has a finite value."""
    lrs = sorted(lr for lr, by_seed in by_lr.items() if set(seeds) <= set(by_seed))
    if not lrs:
        return None
    if len(lrs) == 1:
        values = [by_lr[lrs[0]][s] for s in seeds]
        return lrs[0], True, values
    try:
        found = optimum.fit_optimum(lrs, {s: [by_lr[lr][s] for lr in lrs] for s in seeds},
                                    n_boot=0)
    except ValueError:  # no LR with a finite loss
        return None
    return found.best_lr, not found.interior, [by_lr[found.best_lr][s] for s in seeds]


def c_curves(rows: list[dict], init: str, key: str = "final_val_bpb") -> dict[int, CCurve]:
    """d_k -> the curve over c of the init's runs (`key` chooses; lower is better)."""
    out = {}
    for d_k, by_c in sorted(_grid([r for r in rows if init_of(r) == init], key).items()):
        seeds = sorted({s for by_lr in by_c.values() for by_seed in by_lr.values()
                        for s in by_seed})
        points = {c: p for c, by_lr in by_c.items() if (p := _at_best_lr(by_lr, seeds))}
        cs = sorted(points)
        if len(cs) < 2:
            continue
        out[d_k] = CCurve(tuple(cs), tuple(points[c][0] for c in cs),
                          tuple(points[c][1] for c in cs),
                          {s: [points[c][2][i] for c in cs] for i, s in enumerate(seeds)})
    return out


def locate(curve: CCurve, n_boot: int = 200, seed: int = 0) -> optimum.Optimum | None:
    """c* of one curve (`optimum.fit_optimum` over log c), or None when no c finished."""
    try:
        return optimum.fit_optimum(curve.cs, curve.losses_by_seed, n_boot=n_boot, seed=seed)
    except ValueError:
        return None


def lr_edge_near(curve: CCurve, found: optimum.Optimum) -> bool:
    """Whether the best c or a neighbour took its LR from its LR grid's edge."""
    best = curve.cs.index(found.best_lr)
    return any(curve.lr_edges[max(best - 1, 0):best + 2])


def ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None]:
    """(slope, intercept, the slope's standard error; None below three points)."""
    slope, intercept = np.polyfit(x, y, 1)
    n = len(x)
    if n < 3:
        return float(slope), float(intercept), None
    residuals = y - (slope * x + intercept)
    se = math.sqrt(float(residuals @ residuals) / (n - 2) / float(((x - x.mean()) ** 2).sum()))
    return float(slope), float(intercept), se


def t_interval(value: float, se: float | None, df: int,
               confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    if se is None or df < 1:
        return None
    half = intervals.t_quantile(df, confidence) * se
    return value - half, value + half


@dataclasses.dataclass(frozen=True)
class ExponentFit:
    """The fit of one (init, metric): c* per d_k, the slope of log c* on log d_k, and α."""

    init: str
    optima: dict[int, optimum.Optimum]  # d_k -> located c*
    unsettled: dict[int, str]  # d_k -> why its c* is not a location (edge, LR edge)
    slope: float | None  # over the interior d_k
    slope_se: float | None  # the regression's standard error (None below three d_k)
    slope_ci_bootstrap: tuple[float, float] | None
    n_seeds: int
    boot_slopes: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)
    confidence: float = CONFIDENCE

    @property
    def settled(self) -> list[int]:
        """The d_k whose c* is a location (the regression's points)."""
        return [d for d in sorted(self.optima) if d not in self.unsettled]

    @property
    def slope_ci_t(self) -> tuple[float, float] | None:
        return t_interval(self.slope, self.slope_se, len(self.settled) - 2, self.confidence)

    @property
    def slope_ci(self) -> tuple[float, float] | None:
        """The decision interval: the union of the bootstrap and the t interval (both needed)."""
        if self.slope_ci_bootstrap is None or self.slope_ci_t is None:
            return None
        return (min(self.slope_ci_bootstrap[0], self.slope_ci_t[0]),
                max(self.slope_ci_bootstrap[1], self.slope_ci_t[1]))

    @property
    def alpha(self) -> float | None:
        return None if self.slope is None else self.slope - 0.5

    @property
    def alpha_ci(self) -> tuple[float, float] | None:
        ci = self.slope_ci
        return None if ci is None else (ci[0] - 0.5, ci[1] - 0.5)


def why_unsettled(curve: CCurve, found: optimum.Optimum) -> str | None:
    """Why `found` is not a location of c* (a bound, not an optimum), or None when it is."""
    if not found.interior:
        more = ", ".join(f"{c:.3g}" for c in optimum.refine_points(curve.cs, found.mean_losses))
        return f"best c {found.best_lr:g} on the grid's {found.edge} edge (run c = {more})"
    if lr_edge_near(curve, found):
        return "the best c or a neighbour took its LR from its LR grid's edge"
    return None


def _matrix(curve: CCurve) -> np.ndarray:
    """[seeds, cs] values, nan for a run without a finite value."""
    return np.array([[np.nan if v is None else v for v in values]
                     for values in curve.losses_by_seed.values()], dtype=float)


def bootstrap_slopes(curves: dict[int, CCurve], n_boot: int = N_BOOT,
                     seed: int = 0) -> np.ndarray:
    """The slope of log c* on log d_k refitted on `n_boot` resamples: each d_k's seeds drawn
    with replacement, independently (different d_k are different runs), c* refitted."""
    rng = np.random.default_rng(seed)
    d_ks = sorted(curves)
    x = np.log(np.array(d_ks, dtype=float))
    matrices = [_matrix(curves[d]) for d in d_ks]
    slopes = np.empty(n_boot)
    for b in range(n_boot):
        log_c = []
        for d_k, matrix in zip(d_ks, matrices, strict=True):
            draw = matrix[rng.integers(0, matrix.shape[0], matrix.shape[0])]
            losses = {i: [None if math.isnan(v) else v for v in row] for i, row in enumerate(draw)}
            log_c.append(math.log(optimum.fit_optimum(curves[d_k].cs, losses, n_boot=0).lr_star))
        slopes[b] = np.polyfit(x, np.array(log_c), 1)[0]
    return slopes


def fit(rows: list[dict], init: str, key: str = "final_val_bpb", *, n_boot: int = N_BOOT,
        seed: int = 0, confidence: float = CONFIDENCE) -> ExponentFit:
    """The exponent fit of one init's runs, `key` choosing each c's LR and locating c*."""
    curves = c_curves(rows, init, key)
    optima, unsettled = {}, {}
    for d_k, curve in curves.items():
        if (found := locate(curve, seed=seed)) is None:
            unsettled[d_k] = "no c has a finite value"
            continue
        optima[d_k] = found
        if (why := why_unsettled(curve, found)) is not None:
            unsettled[d_k] = why
    settled = {d: curves[d] for d in optima if d not in unsettled}
    n_seeds = min((len(c.losses_by_seed) for c in settled.values()), default=0)
    if len(settled) < 2:
        return ExponentFit(init, optima, unsettled, None, None, None, n_seeds)
    x = np.log(np.array(sorted(settled), dtype=float))
    y = np.log(np.array([optima[d].lr_star for d in sorted(settled)]))
    slope, _, se = ols(x, y)
    boot, boot_ci = None, None
    if n_seeds >= 2 and n_boot > 0:
        boot = bootstrap_slopes(settled, n_boot, seed)
        tail = 100 * (1 - confidence) / 2
        low, high = np.percentile(boot, [tail, 100 - tail])
        boot_ci = (float(low), float(high))
    return ExponentFit(init, optima, unsettled, slope, se, boot_ci, n_seeds, boot, confidence)


# --------------------------------------------------------------------------- the claims' rules

EARLY_KEY = "val_bpb_at_half_steps"  # report.summarise_run: the evaluation at train.steps // 2


def _ci_text(ci: tuple[float, float] | None) -> str:
    return "n/a" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def fit_lines(found: ExponentFit, label: str = "") -> list[str]:
    """The numbers of one fit: c* per d_k, then the slope and α with their intervals."""
    head = f"{found.init}{label}"
    lines = []
    for d_k, o in sorted(found.optima.items()):
        ci = "" if o.lr_ci is None else f" [{o.lr_ci[0]:.3g}, {o.lr_ci[1]:.3g}]"
        why = found.unsettled.get(d_k)
        lines.append(f"{head} d_k={d_k}: c* {o.lr_star:.3g}{ci} at {o.loss_star:.4f}"
                     + (f" — not a location: {why}" if why else ""))
    if found.slope is None:
        return [*lines, f"{head}: fewer than two d_k with a located c*: no slope"]
    lines.append(f"{head}: slope of log c* on log d_k {found.slope:+.3f} over d_k "
                 f"{found.settled} ({found.n_seeds} seeds); 95% bootstrap over seeds "
                 f"{_ci_text(found.slope_ci_bootstrap)}, regression t "
                 f"{_ci_text(found.slope_ci_t)}; α = {found.alpha:+.3f}, CI (union) "
                 f"{_ci_text(found.alpha_ci)}")
    return lines


# The exponents the question is between: μP's 1/d_k, 1/√d_k, no divisor.
CANDIDATES = (-1.0, -0.5, 0.0)


def _signed(value: float) -> str:
    return f"{value:g}".replace("-", "−")  # the minus sign the rules print


def _placed(ci: tuple[float, float], low: float, high: float) -> str:
    """'inside' [low, high], 'outside' it (no overlap), or 'across' its edge."""
    if low <= ci[0] and ci[1] <= high:
        return "inside"
    return "outside" if ci[1] < low or ci[0] > high else "across"


@dataclasses.dataclass(frozen=True)
class Exponent:
    """Claim: with `init`, the optimal scale is ∝ d_k^expected, one of the `CANDIDATES`
    (−1: μP's 1/d_k; −1/2: 1/√d_k; 0: no divisor). Supported when the CI of α excludes the
    other candidates and lies within expected ± margin; contradicted when it lies wholly
    outside expected ± margin; otherwise (an interval across the band's edge, a c* on its
    grid's edge, too few seeds or d_k) inconclusive. The default margin, 0.25, is half the
    distance between neighbouring candidates: an interval inside it is closer to `expected`
    than to either neighbour. Not part of the study's Holm family: a decision by interval, at
    95%."""

    init: str
    expected: float = -0.5
    margin: float = 0.25
    metric: str = "final_val_bpb"  # chooses each c's LR and locates c* (validation)

    @property
    def policies(self) -> tuple[str, ...]:
        """The family's member every grid runs (C = 1), for checks that claims name run
        policies."""
        return ("inv_sqrt_dk",)

    @property
    def others(self) -> tuple[float, ...]:
        return tuple(c for c in CANDIDATES if c != self.expected)

    def describe(self) -> str:
        others = " and ".join(_signed(c) for c in self.others)
        return (f"supported if the 95% CI of α (optimal scale ∝ d_k^α; α = slope of log c* on "
                f"log d_k − 1/2, c* the best c of c·d_k^(-1/2), each c at its best LR, "
                f"{self.metric}) excludes {others} and lies within {_signed(self.expected)} ± "
                f"{self.margin:g}, init {self.init} (analysis/exponent.py states the fit)")

    def judge(self, rows: list[dict]) -> Verdict:
        found = fit(rows, self.init, self.metric)
        numbers = tuple(fit_lines(found))
        ci = found.alpha_ci
        if ci is None:
            return Verdict("inconclusive", "no interval for α (too few located c*, d_k or "
                           "seeds)", numbers)
        if found.unsettled:  # a bound is no location: refine the grid (the numbers say how)
            return Verdict("inconclusive", "some d_k's c* is not a location", numbers)
        place = _placed(ci, self.expected - self.margin, self.expected + self.margin)
        if place == "outside":
            return Verdict("contradicted", f"α's CI {_ci_text(ci)} lies outside "
                           f"{_signed(self.expected)} ± {self.margin:g}", numbers)
        excludes = not any(ci[0] <= c <= ci[1] for c in self.others)
        if place == "inside" and excludes:
            return Verdict("supported", f"α's CI {_ci_text(ci)} lies within "
                           f"{_signed(self.expected)} ± {self.margin:g}", numbers)
        others = " or ".join(_signed(c) for c in self.others)
        return Verdict("inconclusive", f"α's CI {_ci_text(ci)} crosses the band's edge "
                       f"or holds {others}", numbers)


def shift_interval(early: ExponentFit, final: ExponentFit) -> tuple[float, float] | None:
    """The 95% interval of Δα = α_final − α_early: the union of a paired bootstrap (the same
    seed draws at both budgets: the same runs, read at two steps) and a t interval whose
    standard error treats the two slopes as independent (the snapshots of one run are
    positively correlated, so this overstates the spread: conservative)."""
    if (early.slope is None or final.slope is None or early.settled != final.settled
            or early.boot_slopes is None or final.boot_slopes is None
            or len(early.boot_slopes) != len(final.boot_slopes)):
        return None
    if early.slope_se is None or final.slope_se is None:
        return None
    delta = final.slope - early.slope
    tail = 100 * (1 - final.confidence) / 2
    low, high = np.percentile(final.boot_slopes - early.boot_slopes, [tail, 100 - tail])
    se = math.hypot(early.slope_se, final.slope_se)
    t_low, t_high = t_interval(delta, se, len(final.settled) - 2, final.confidence)
    return float(min(low, t_low)), float(max(high, t_high))


@dataclasses.dataclass(frozen=True)
class ExponentShift:
    """Claim: with `init`, α is the same at an early budget (`early`, the validation metric
    halfway through each run) and at the end (`final`): supported when the 95% interval of
    Δα = α_final − α_early lies within ±margin, contradicted when it lies wholly outside,
    inconclusive otherwise or when either fit is unsettled or the two fits use different d_k.
    Each budget chooses its own LR and c*. The early point is a snapshot of the same runs,
    before the cosine schedule has decayed, not a shorter run with its own schedule."""

    init: str
    early: str = EARLY_KEY
    final: str = "final_val_bpb"
    margin: float = 0.25

    @property
    def policies(self) -> tuple[str, ...]:
        """The family's member every grid runs (C = 1), for checks that claims name run
        policies."""
        return ("inv_sqrt_dk",)

    def describe(self) -> str:
        return (f"supported if α moves by less than ±{self.margin:g} between {self.early} and "
                f"{self.final} (95% CI of the difference: paired bootstrap over seeds ∪ t), "
                f"init {self.init}")

    def judge(self, rows: list[dict]) -> Verdict:
        early, final = fit(rows, self.init, self.early), fit(rows, self.init, self.final)
        numbers = [*fit_lines(early, f" ({self.early})"), *fit_lines(final, f" ({self.final})")]
        ci = None if early.unsettled or final.unsettled else shift_interval(early, final)
        if ci is None:
            return Verdict("inconclusive", "α is not located at both budgets on the same d_k",
                           tuple(numbers))
        numbers.append(f"{self.init}: Δα = {final.slope - early.slope:+.3f}, CI {_ci_text(ci)}")
        place = _placed(ci, -self.margin, self.margin)
        verdict = {"inside": "supported", "outside": "contradicted"}.get(place, "inconclusive")
        return Verdict(verdict, f"Δα's CI {_ci_text(ci)} is {place} ±{self.margin:g}",
                       tuple(numbers))
