"""Statistics for verdicts: paired t-tests, equivalence (TOST), Holm's correction, Wilson
intervals and Fisher's exact test, in pure Python (the report runs without scipy).

Rules and conventions, stated once:

- A test rejects its null hypothesis when its p-value is below alpha (`p < alpha`, alpha = 0.05
  by default); with several claims judged on one report the p-values of the family go through
  `holm` first and the adjusted values are compared with alpha. Holm controls the family-wise
  error rate under any dependence between the tests (runs share seeds and data), which is why it
  is used rather than Benjamini-Hochberg (false discovery rate, needs independence or positive
  dependence) or plain Bonferroni (uniformly less powerful than Holm).
- Paired tests work on per-seed differences (policy − reference on the same seed and data
  order), so that seed-to-seed variation common to both arms cancels. The t-test's degrees of
  freedom are n − 1.
- Too few pairs: with n < 2 no variance can be estimated and every p-value here is NaN (a NaN
  is "not tested", never "significant"); `holm` keeps a NaN as NaN and counts it in the family as
  the least significant member, so an untestable claim never makes the others look stronger.
- Zero variance (every difference equal, n >= 2): t is the limit ±inf, or 0/0 when the mean sits
  on the null boundary. The p-value is that of the limit: 0 when the mean is strictly on the
  alternative's side, 1 otherwise (a mean exactly on the boundary is not evidence against it).
- Equivalence (TOST, Schuirmann 1987): the mean difference lies within ±margin when both
  one-sided nulls, mean <= −margin and mean >= +margin, are rejected; its p-value is the larger
  of the two one-sided p-values (an intersection-union test, so it needs no correction of its
  own and enters `holm` like any other p-value).
- Wilson's score interval for a proportion (success rates over seeds): unlike the Wald interval
  it stays inside [0, 1] and keeps near-nominal coverage at n = 3-30 and rates near 0 or 1,
  which is where the seeds of a sweep sit.
- A trend in proportions over ordered groups (`exact_trend_p`, the exact conditional form of
  the Cochran-Armitage test): the statistic T = sum of score × events, with the groups' sizes
  and the total of events fixed, has a distribution that needs no large-sample approximation
  (the counts here are 0-18 a group); the one-sided p-values are its tails. Scores are the
  groups' ranks (0, 1, 2, …: log2 d_k on a ×2 grid).
- Fisher's exact test (two-sided) for two success rates: the sum of the hypergeometric
  probabilities of every table no more probable than the observed one, given the margins. A
  table counts as "no more probable" within a relative tolerance of 1e-7 (as R's fisher.test),
  so that tables of equal probability are not split by rounding; the probabilities here are
  exact integer ratios, so the tolerance only matters for near-ties.

The Student-t tail comes from the regularized incomplete beta function (continued fraction,
Numerical Recipes §6.4), accurate in the far tail where 1 − CDF would cancel; the normal
quantile is Acklam's rational approximation refined by one Halley step on math.erfc.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence

ALPHA = 0.05
FISHER_RELATIVE_TOLERANCE = 1e-7  # as R's fisher.test: ties within this ratio count as equal
_CF_EPS = 1e-15
_CF_TINY = 1e-300
_CF_MAX_ITER = 10_000


# --- special functions ----------------------------------------------------------------------

def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) by the modified Lentz method (NR eq. 6.4.5)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
    h = d
    for m in range(1, _CF_MAX_ITER + 1):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                          -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _CF_TINY else _CF_TINY
            h *= d * c
        if abs(d * c - 1.0) < _CF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    # The fraction converges fast only for x < (a+1)/(a+b+2); use the symmetry beyond it.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` > 0 degrees of freedom (±inf allowed)."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return tail if t >= 0 else 1.0 - tail


def normal_quantile(p: float) -> float:
    """The x with Φ(x) = p for the standard normal, 0 < p < 1 (Acklam + one Halley step)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p > 0.5:  # by symmetry, where erfc is accurate (1 − p is exact for p >= 0.5)
        return -normal_quantile(1.0 - p)
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)
    if p < 0.02425:  # the lower tail, in q = sqrt(-2 log p)
        q = math.sqrt(-2.0 * math.log(p))
        x = ((((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5])
             / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0))
    else:
        q = p - 0.5
        r = q * q
        x = ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
             / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0))
    # Acklam's relative error is 1.15e-9; one Halley step brings it to double precision.
    error = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p
    u = error * math.sqrt(2.0 * math.pi) * math.exp(x * x / 2.0)
    return x - u / (1.0 + x * u / 2.0)


# --- tests on paired differences ---------------------------------------------------------------

def _mean_and_se(differences: Sequence[float]) -> tuple[float, float, int]:
    values = [float(v) for v in differences]
    n = len(values)
    if n < 2:
        return (values[0] if values else math.nan), math.nan, n
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(n), n


def _upper_tail_p(shifted_mean: float, se: float, df: int) -> float:
    """P(T >= (mean − null)/se) for H1: mean > null, given mean − null; the zero-variance
    limit per the module's rule."""
    if se == 0:
        return 0.0 if shifted_mean > 0 else 1.0
    return t_sf(shifted_mean / se, df)


def paired_t_p(differences: Sequence[float]) -> float:
    """Two-sided p-value of the one-sample t-test of mean(differences) = 0; NaN when n < 2;
    with zero variance 0.0 for a non-zero mean and 1.0 for a zero mean."""
    mean, se, n = _mean_and_se(differences)
    if n < 2:
        return math.nan
    if se == 0:
        return 0.0 if mean != 0 else 1.0
    return min(1.0, 2.0 * t_sf(abs(mean / se), n - 1))


@dataclasses.dataclass(frozen=True)
class TostResult:
    """Two one-sided tests of |mean| < margin on paired differences."""

    mean: float
    n: int
    p_lower: float  # H0: mean <= -margin
    p_upper: float  # H0: mean >= +margin
    p: float  # max(p_lower, p_upper): the equivalence p-value
    equivalent: bool  # p < alpha


def tost(differences: Sequence[float], margin: float, alpha: float = ALPHA) -> TostResult:
    """Equivalence within ±margin of the mean paired difference (NaN p-values, not
    equivalent, when n < 2)."""
    if not margin > 0:
        raise ValueError(f"the equivalence margin must be > 0, got {margin}")
    mean, se, n = _mean_and_se(differences)
    if n < 2:
        return TostResult(mean, n, math.nan, math.nan, math.nan, False)
    p_lower = _upper_tail_p(mean + margin, se, n - 1)  # H1: mean > -margin
    p_upper = _upper_tail_p(margin - mean, se, n - 1)  # H1: mean < +margin, by symmetry of t
    p = max(p_lower, p_upper)
    return TostResult(mean, n, p_lower, p_upper, p, p < alpha)


def tost_p(differences: Sequence[float], margin: float) -> float:
    """The TOST p-value alone, for a family of claims corrected with `holm`."""
    return tost(differences, margin).p


# --- multiple comparisons ---------------------------------------------------------------------

def holm(p_values: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in input order: the k-th smallest becomes
    max over j <= k of min(1, (m − j + 1) · p_(j)). NaN stays NaN and ranks last."""
    m = len(p_values)
    for p in p_values:
        if not (math.isnan(p) or 0.0 <= p <= 1.0):
            raise ValueError(f"p-values must be in [0, 1] or NaN, got {p}")
    # NaN sorts after every p-value: it counts in m without lowering anyone's multiplier.
    order = sorted(range(m), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
    adjusted = [math.nan] * m
    running = 0.0
    for rank, index in enumerate(order):
        p = p_values[index]
        if math.isnan(p):
            continue
        running = max(running, min(1.0, (m - rank) * p))  # max keeps the sequence monotone
        adjusted[index] = running
    return adjusted


# --- proportions ------------------------------------------------------------------------------

def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion successes/n (n >= 1)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes}/{n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = normal_quantile(0.5 + confidence / 2.0)
    p = successes / n
    denominator = 2.0 * (n + z * z)
    centre = (2.0 * n * p + z * z) / denominator
    delta = z / denominator * math.sqrt(4.0 * n * p * (1.0 - p) + z * z)
    # At 0 or n successes the bound is exactly 0 or 1: no rounding just inside or outside.
    low = 0.0 if successes == 0 else max(0.0, centre - delta)
    high = 1.0 if successes == n else min(1.0, centre + delta)
    return low, high


def fisher_exact_p(a_success: int, a_n: int, b_success: int, b_n: int) -> float:
    """Two-sided Fisher exact p-value for a_success/a_n against b_success/b_n."""
    if not (0 <= a_success <= a_n and 0 <= b_success <= b_n):
        raise ValueError(f"need 0 <= successes <= n, got {a_success}/{a_n}, {b_success}/{b_n}")
    total, successes = a_n + b_n, a_success + b_success
    # Weight of x successes in arm a given the margins: C(K, x) C(N − K, a_n − x), an exact
    # integer; the probability is the weight over C(N, a_n).
    low, high = max(0, a_n - (total - successes)), min(a_n, successes)
    weights = {x: math.comb(successes, x) * math.comb(total - successes, a_n - x)
               for x in range(low, high + 1)}
    observed = weights[a_success]
    scale = round(1 / FISHER_RELATIVE_TOLERANCE)
    # w <= observed · (1 + tol), in integers: w · scale <= observed · (scale + 1).
    extreme = sum(w for w in weights.values() if w * scale <= observed * (scale + 1))
    return min(1.0, extreme / math.comb(total, a_n))


def exact_trend_p(groups: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """(P(T >= observed), P(T <= observed)) for (events, runs) per group in score order: the
    exact conditional trend test. Under no trend every way of placing the K events among the N
    runs is equally likely, so a group's count x has weight C(n, x) and the counts' joint
    weight is the product; a dynamic programme over the groups sums the weights by (events
    placed, T). Both tails are exact integers over C(N, K)."""
    if any(not 0 <= k <= n for k, n in groups):
        raise ValueError(f"need 0 <= events <= runs in every group, got {list(groups)}")
    total_events = sum(k for k, _ in groups)
    observed = sum(score * k for score, (k, _) in enumerate(groups))
    weights: dict[tuple[int, int], int] = {(0, 0): 1}  # (events placed, T) -> weight
    for score, (_, n) in enumerate(groups):
        grown: dict[tuple[int, int], int] = defaultdict(int)
        for (placed, statistic), weight in weights.items():
            for x in range(min(n, total_events - placed) + 1):
                grown[(placed + x, statistic + score * x)] += weight * math.comb(n, x)
        weights = grown
    tails = [(statistic, w) for (placed, statistic), w in weights.items()
             if placed == total_events]
    whole = sum(w for _, w in tails)
    upper = sum(w for statistic, w in tails if statistic >= observed)
    lower = sum(w for statistic, w in tails if statistic <= observed)
    return upper / whole, lower / whole
