"""The claims about the optimal scale's exponent (experiments/dk_exponent.py and
dk_exponent_regime.py), each judged from `exponent.fit`: α per init (and d_k range, and budget),
one power law, the cost of 1/√d_k against the best c, and α the same at two budgets."""

from __future__ import annotations

import dataclasses
import math

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import exponent, located, tolerance
from scale_ablation.analysis.claims import Verdict

EARLY_KEY = "val_bpb_at_half_steps"  # report.summarise_run: the evaluation at train.steps // 2


def _ci_text(ci: tuple[float, float] | None) -> str:
    return "n/a" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _c_ci_text(found: located.Located) -> str:
    """c*'s interval; an end beyond the grid is written as a bound past its edge."""
    low, high = found.log_ci
    left = f"< {found.grid[0]:.3g}" if low == -math.inf else f"{math.exp(low):.3g}"
    right = f"> {found.grid[-1]:.3g}" if high == math.inf else f"{math.exp(high):.3g}"
    return f"[{left}, {right}]"


def _steps_text(steps: int | None) -> str:
    return "" if steps is None else f", runs of {steps} steps"


def _range_text(d_k_range: tuple[int, int] | None) -> str:
    return "" if d_k_range is None else f" over d_k {d_k_range[0]}–{d_k_range[1]}"


def fit_lines(found: exponent.ExponentFit, label: str = "") -> list[str]:
    """The numbers of one fit: c* per d_k, then the slope and α with their intervals."""
    head = f"{found.init}{label}"
    lines = []
    for d_k, o in sorted(found.optima.items()):
        why = found.unsettled.get(d_k)
        lines.append(f"{head} d_k={d_k}: c* {o.star:.3g} {_c_ci_text(o)} (best c {o.best[0]:g} "
                     f"at LR {o.best[1]:.3g}; {o.n_seeds} seeds)"
                     + (f" — not a location: {why}" if why else ""))
    lines += [f"{head} d_k={d}: {why}" for d, why in found.unsettled.items()
              if d not in found.optima]
    if found.slope is None:
        return [*lines, f"{head}: fewer than two d_k with a located c*: no slope"]
    lines.append(f"{head}: slope of log c* on log d_k {found.slope:+.3f} over d_k "
                 f"{found.settled} ({found.n_seeds} seeds), 95% CI {_ci_text(found.slope_ci)} "
                 f"(the LR and c* re-chosen in every draw); α = {found.alpha:+.3f}, CI "
                 f"{_ci_text(found.alpha_ci)}")
    return lines


# The exponents the question is between: μP's 1/d_k, 1/√d_k, no divisor.
CANDIDATES = (-1.0, -0.5, 0.0)
MARGIN = 0.25  # half the distance between neighbouring candidates
# An interval inside the band supports a claim of "within ± margin", one wholly outside it
# contradicts it; across its edge it is inconclusive.
BY_PLACE = {"inside": "supported", "outside": "contradicted"}


def _signed(value: float) -> str:
    return f"{value:g}".replace("-", "−")  # the minus sign the rules print


def _placed(ci: tuple[float, float], low: float, high: float) -> str:
    """'inside' [low, high], 'outside' it (no overlap), or 'across' its edge."""
    if low <= ci[0] and ci[1] <= high:
        return "inside"
    return "outside" if ci[1] < low or ci[0] > high else "across"


class _Family:
    """The family's member every grid runs (C = 1), for checks that claims name run policies."""

    @property
    def policies(self) -> tuple[str, ...]:
        return ("inv_sqrt_dk",)


@dataclasses.dataclass(frozen=True)
class Exponent(_Family):
    """Claim: with `init` (over `d_k_range`, inclusive, when given), the optimal scale is
    ∝ d_k^expected, one of the `CANDIDATES` (−1: μP's 1/d_k; −1/2: 1/√d_k; 0: no divisor).
    Supported when the CI of α excludes the other candidates and lies within expected ± margin;
    contradicted when it lies wholly outside expected ± margin; otherwise (an interval across
    the band's edge, a c* on its grid's edge, too few seeds or d_k) inconclusive. The default
    margin, 0.25, is half the distance between neighbouring candidates: an interval inside it
    is closer to `expected` than to either neighbour. Not part of the study's Holm family: a
    decision by interval, at 95%."""

    init: str
    expected: float = -0.5
    margin: float = MARGIN
    metric: str = "final_val_bpb"  # chooses each c's LR and locates c* (validation)
    d_k_range: tuple[int, int] | None = None
    steps: int | None = None  # the runs of one budget, where budgets are runs of their own

    @property
    def others(self) -> tuple[float, ...]:
        return tuple(c for c in CANDIDATES if c != self.expected)

    def describe(self) -> str:
        others = " and ".join(_signed(c) for c in self.others)
        return (f"supported if the 95% CI of α (optimal scale ∝ d_k^α; α = slope of log c* on "
                f"log d_k − 1/2, c* the best c of c·d_k^(-1/2), each c at its best LR, "
                f"{self.metric}{_range_text(self.d_k_range)}{_steps_text(self.steps)}) excludes "
                f"{others} and lies "
                f"within {_signed(self.expected)} ± {self.margin:g}, init {self.init} "
                "(analysis/exponent.py states the fit)")

    def judge(self, rows: list[dict]) -> Verdict:
        found = exponent.fit(rows, self.init, self.metric, d_k_range=self.d_k_range, steps=self.steps)
        numbers = tuple(fit_lines(found, _steps_text(self.steps)))
        ci = found.alpha_ci
        if found.unsettled:  # a bound is no location: refine the grid (the numbers say how)
            return Verdict("inconclusive", "some d_k's c* is not a location", numbers)
        if ci is None:
            return Verdict("inconclusive", "no interval for α (too few located c*, d_k or "
                           "seeds)", numbers)
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


@dataclasses.dataclass(frozen=True)
class OnePowerLaw(_Family):
    """Claim: with `init`, one power law describes c* over the d_k run: log c* is straight in
    log d_k. The quadratic's curvature b₂ changes the local slope by 2·b₂·(span of ln d_k)
    across the range; supported when that change's CI lies within ±margin (the exponent claims'
    margin: a bend too small to move α between candidates), contradicted when it lies wholly
    outside, inconclusive otherwise or with fewer than three located d_k."""

    init: str
    margin: float = MARGIN
    metric: str = "final_val_bpb"
    steps: int | None = None  # the runs of one budget, where budgets are runs of their own

    def describe(self) -> str:
        return (f"supported if the local α of log c* on log d_k (a quadratic; located.py's "
                f"draws) changes by less than ±{self.margin:g} across the d_k run (95% CI), "
                f"contradicted if by more, init {self.init}, {self.metric}"
                f"{_steps_text(self.steps)}")

    def judge(self, rows: list[dict]) -> Verdict:
        found = exponent.fit(rows, self.init, self.metric, steps=self.steps)
        numbers = list(fit_lines(found))
        if found.unsettled or (curve := found.curve()) is None:
            return Verdict("inconclusive", "fewer than three d_k with a located c*, or some "
                           "d_k's c* is not a location", tuple(numbers))
        span = math.log(max(found.settled) / min(found.settled))
        change = tuple(2 * span * end for end in curve.curvature_ci)
        numbers += [f"{self.init}: curvature of log c* in log d_k {curve.curvature:+.3f}, CI "
                    f"{_ci_text(curve.curvature_ci)}: α changes by {2 * span * curve.curvature:+.3f}"
                    f" {_ci_text(change)} from d_k {min(found.settled)} to {max(found.settled)}",
                    f"{self.init}: local α " + "; ".join(
                        f"d_k={d}: {s - 0.5:+.2f} {_ci_text((ci[0] - 0.5, ci[1] - 0.5))}"
                        for d, (s, ci) in curve.local_slopes.items())]
        place = _placed(change, -self.margin, self.margin)
        verdict = BY_PLACE.get(place, "inconclusive")
        return Verdict(verdict, f"α's change across d_k, CI {_ci_text(change)}, is {place} "
                       f"±{self.margin:g}", tuple(numbers))


@dataclasses.dataclass(frozen=True)
class ScaleCost(_Family):
    """Claim: with `init`, the scale c·d_k^(-1/2) at c = `c` (1: 1/√d_k) costs less than
    `margin` (in the metric's units) against the best c at every d_k, each c at its own best
    LR. Supported when every d_k's cost CI lies below the margin (an equivalence by interval),
    contradicted when some d_k's lies wholly above it, inconclusive otherwise. The intervals
    are Bonferroni's over the d_k (each at 1 − 0.05/n), so that "some d_k" is not the best of n
    chances. The numbers give per d_k the range of c within the margin and within the study's
    noise floor, and the cost of 1/√d_k and of 1/d_k (c = d_k^(-1/2), where the grid has it)."""

    init: str
    c: float = 1.0
    margin: float = 0.02
    metric: str = "final_val_bpb"
    steps: int | None = None  # the runs of one budget, where budgets are runs of their own

    def describe(self) -> str:
        return (f"supported if c = {self.c:g} (scale {self.c:g}/√d_k) is within {self.margin:g} "
                f"of the best c at every d_k, contradicted if it is not at some d_k (the cost's "
                f"CI, Bonferroni over the d_k; each c at its best LR, LR and best c re-chosen in "
                f"every draw), init {self.init}, {self.metric}{_steps_text(self.steps)}")

    def judge(self, rows: list[dict]) -> Verdict:
        mine = exponent.init_rows(rows, self.init, steps=self.steps)
        grids = located.c_grids(mine, self.metric)
        floor = cmp.noise_floor(mine, "inv_sqrt_dk", self.metric)
        numbers, above, unknown = [], [], []
        confidence = 1 - (1 - exponent.CONFIDENCE) / max(len(grids), 1)
        for d_k, grid in sorted(grids.items()):
            try:
                line, cost = _tolerance_line(grid, d_k, self.c, self.margin, floor, confidence)
            except ValueError as error:
                numbers.append(f"{self.init} d_k={d_k}: no tolerance ({error})")
                unknown.append(d_k)
                continue
            numbers.append(f"{self.init} " + line)
            if cost is None or cost[1] >= self.margin:
                (above if cost is not None and cost[0] >= self.margin else unknown).append(d_k)
        numbers = tuple(numbers)
        if not grids:
            return Verdict("inconclusive", "no runs of the family", numbers)
        if above:
            return Verdict("contradicted", f"c = {self.c:g} costs more than {self.margin:g} at "
                           f"d_k {above}", numbers)
        if unknown:
            return Verdict("inconclusive", f"the cost's CI reaches {self.margin:g} (or c = "
                           f"{self.c:g} was not run) at d_k {unknown}", numbers)
        return Verdict("supported", f"c = {self.c:g} is within {self.margin:g} of the best at "
                       "every d_k", numbers)


def _tolerance_line(grid: dict, d_k: int, c: float, margin: float,
                    floor: cmp.NoiseFloor | None, confidence: float
                    ) -> tuple[str, tuple[float, float] | None]:
    """One d_k's tolerance ranges and costs, and the CI of c's cost (None: c not on its grid)."""
    inv_dk = d_k ** -0.5  # 1/d_k as c·d_k^(-1/2)
    found = tolerance.tolerance(grid, margin, (c, inv_dk), seed=[d_k, 1], confidence=confidence)
    parts = [f"d_k={d_k}: c within {margin:g} of the best {_log_range_text(found)}"]
    if floor is not None:
        noise = tolerance.tolerance(grid, floor.median, seed=[d_k, 2], confidence=confidence)
        parts.append(f"within the noise floor ({floor.median:.3f}) {_log_range_text(noise)}")
    for name, value in (("1/√d_k", c), ("1/d_k", inv_dk)):
        if value in found.costs:
            cost, ci = found.costs[value]
            parts.append(f"{name} costs {cost:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]")
    cost = found.costs.get(c)
    return "; ".join(parts), None if cost is None else cost[1]


def _log_range_text(found: tolerance.Tolerance) -> str:
    (low_low, _), (_, high_high) = found.log_range_ci
    low, high = found.log_range
    def end(value: float, bound: str) -> str:
        return bound if not math.isfinite(value) else f"{math.exp(value):.3g}"
    return (f"{end(low, 'past the grid')}–{end(high, 'past the grid')} (CI of the range's "
            f"ends: from {end(low_low, 'past the grid')} to {end(high_high, 'past the grid')})")


@dataclasses.dataclass(frozen=True)
class ExponentShift(_Family):
    """Claim: with `init`, α is the same at an early budget (`early`, the validation metric
    halfway through each run) and at the end (`final`): supported when the 95% interval of
    Δα = α_final − α_early lies within ±margin, contradicted when it lies wholly outside,
    inconclusive otherwise or when either fit is unsettled or the two fits use different d_k.
    Each budget chooses its own LR and c*. The interval is of the difference of independent
    draws of the two fits: the two budgets are snapshots of the same runs, positively
    correlated, so it overstates the spread (conservative). The early point is a snapshot
    before the cosine schedule has decayed, not a shorter run with its own schedule."""

    init: str
    early: str = EARLY_KEY
    final: str = "final_val_bpb"
    margin: float = MARGIN
    # Budgets run as runs of their own (train.steps, short and long): each fitted on its runs'
    # `final` metric; `early` is then unused.
    budgets: tuple[int, int] | None = None

    def describe(self) -> str:
        between = (f"{self.early} and {self.final}" if self.budgets is None else
                   f"runs of {self.budgets[0]} and of {self.budgets[1]} steps ({self.final})")
        return (f"supported if α moves by less than ±{self.margin:g} between {between} (95% CI "
                f"of the difference of the two fits' draws), init {self.init}")

    def judge(self, rows: list[dict]) -> Verdict:
        if self.budgets is None:
            early = exponent.fit(rows, self.init, self.early)
            final = exponent.fit(rows, self.init, self.final, seed=1)
            labels = (f" ({self.early})", f" ({self.final})")
        else:
            early = exponent.fit(rows, self.init, self.final, steps=self.budgets[0])
            final = exponent.fit(rows, self.init, self.final, steps=self.budgets[1], seed=1)
            labels = tuple(_steps_text(b) for b in self.budgets)
        numbers = [*fit_lines(early, labels[0]), *fit_lines(final, labels[1])]
        ci = _shift_interval(early, final)
        if ci is None:
            return Verdict("inconclusive", "α is not located at both budgets on the same d_k",
                           tuple(numbers))
        numbers.append(f"{self.init}: Δα = {final.slope - early.slope:+.3f}, CI {_ci_text(ci)}")
        place = _placed(ci, -self.margin, self.margin)
        verdict = BY_PLACE.get(place, "inconclusive")
        return Verdict(verdict, f"Δα's CI {_ci_text(ci)} is {place} ±{self.margin:g}",
                       tuple(numbers))


def _shift_interval(early: exponent.ExponentFit, final: exponent.ExponentFit) -> tuple[float, float] | None:
    """The CI of Δα from the two fits' draws; None unless both are located on the same d_k
    with bounded slope intervals."""
    if (early.unsettled or final.unsettled or early.slope_fit is None
            or final.slope_fit is None or early.settled != final.settled
            or not all(map(math.isfinite, (*early.slope_ci, *final.slope_ci)))):
        return None
    delta = final.slope_fit.draws - early.slope_fit.draws
    return located.interval(delta, delta, final.confidence)
