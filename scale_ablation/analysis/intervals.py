"""Means with 95% Student-t confidence intervals, and paired differences against a reference.

The t quantile is computed here from the closed-form CDF of Student's t for an integer number
of degrees of freedom (Abramowitz & Stegun 26.7.3-4), so the report needs no scipy at run time.

    estimate = intervals.mean_ci([3.1, 3.0, 3.2])    # Estimate(mean, half_width, n)
    str(estimate)                                    # "3.100 ± 0.248 (n=3)"
    diff = intervals.paired(policy_values, reference_values)
    intervals.decide(diff)                           # "better" | "worse" | "unresolved"
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

CONFIDENCE = 0.95
TOO_FEW = "n<2, no CI"  # the decision when an interval cannot be formed
# The CI contains 0: no difference is resolved. Not a finding of "no difference", which only
# two one-sided tests against a margin can make (`verdicts`, "equivalent").
UNRESOLVED = "unresolved"


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| < t) for T ~ Student t with `df` >= 1 degrees of freedom, t >= 0."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2 == 0:  # sin θ (1 + c²/2 + 1·3 c⁴/(2·4) + ...), ν/2 terms
        term, total = 1.0, 1.0
        for j in range(1, df // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    term, total = 1.0, 1.0  # (2/π)(θ + sin θ cos θ (1 + 2c²/3 + 2·4 c⁴/(3·5) + ...))
    for j in range(1, (df - 1) // 2):
        term *= c2 * (2 * j) / (2 * j + 1)
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def t_quantile(df: int, confidence: float = CONFIDENCE) -> float:
    """The t with P(|T| < t) = confidence: the half-width multiplier of a two-sided interval."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    low, high = 0.0, 1.0
    while _t_two_sided_mass(high, df) < confidence:
        high *= 2
    for _ in range(200):  # bisection to double precision
        mid = (low + high) / 2
        if _t_two_sided_mass(mid, df) < confidence:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A sample mean with the half-width of its 95% CI (None when n < 2)."""

    mean: float
    half_width: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def format(self, digits: int = 3, unit: str = "") -> str:
        """"mean ± half-width unit (n=N)": `unit` with its leading space, or empty."""
        if self.half_width is None:
            return f"{self.mean:.{digits}f}{unit} (n={self.n})"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f}{unit} (n={self.n})"

    def __str__(self) -> str:
        return self.format()


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Estimate:
    """Mean and Student-t CI half-width t_{n-1} · s / √n of `values` (n >= 1)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_ci needs at least one value")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Estimate(mean, None, 1)
    half = t_quantile(len(values) - 1, confidence) * statistics.stdev(values) / math.sqrt(len(values))
    return Estimate(mean, half, len(values))


def paired(values: Sequence[float], reference: Sequence[float]) -> Estimate:
    """The mean difference values[i] − reference[i] over matched pairs, with its CI."""
    if len(values) != len(reference):
        raise ValueError(f"paired: {len(values)} values against {len(reference)} references")
    return mean_ci([v - r for v, r in zip(values, reference, strict=True)])


def decide(difference: Estimate, *, higher_is_better: bool = False) -> str:
    """"better"/"worse" when the CI of (policy − reference) excludes 0, else
    UNRESOLVED; TOO_FEW with fewer than two pairs. Lower is better by default (loss)."""
    if difference.half_width is None:
        return TOO_FEW
    if difference.low <= 0 <= difference.high:
        return UNRESOLVED
    lower = difference.high < 0
    return "better" if lower != higher_is_better else "worse"
