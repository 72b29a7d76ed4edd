"""significance.py against scipy and against Holm's procedure carried out by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import require

from scale_ablation.analysis import significance as sig

scipy_stats = require("scipy.stats")
scipy_special = require("scipy.special")


# --- special functions -------------------------------------------------------------------------

@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 10, 29, 100, 2500])
def test_t_tail_matches_scipy_including_the_far_tail(df):
    for t in (-40.0, -3.0, -0.5, 0.0, 0.3, 1.0, 2.2, 5.0, 12.0, 60.0):
        expected = scipy_stats.t.sf(t, df)
        assert sig.t_sf(t, df) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_regularized_beta_matches_scipy():
    rng = np.random.default_rng(1)
    for _ in range(200):
        a, b = rng.uniform(0.1, 60, size=2)
        x = rng.uniform()
        assert sig.regularized_beta(a, b, x) == pytest.approx(
            scipy_special.betainc(a, b, x), rel=1e-9, abs=1e-14)


def test_normal_quantile_matches_scipy():
    for p in (1e-12, 1e-6, 0.001, 0.02, 0.025, 0.3, 0.5, 0.8, 0.975, 0.99, 1 - 1e-9):
        assert sig.normal_quantile(p) == pytest.approx(scipy_stats.norm.ppf(p), rel=1e-12)
    with pytest.raises(ValueError):
        sig.normal_quantile(1.0)


# --- paired t-test and TOST ---------------------------------------------------------------------

def test_paired_t_matches_scipy_ttest_1samp():
    rng = np.random.default_rng(2)
    for n in (2, 3, 5, 8, 30):
        for shift in (0.0, 0.3, -1.5):
            d = rng.normal(shift, 1.0, size=n)
            expected = scipy_stats.ttest_1samp(d, 0.0).pvalue
            assert sig.paired_t_p(d.tolist()) == pytest.approx(expected, rel=1e-9)


def test_paired_t_degenerate_cases():
    assert math.isnan(sig.paired_t_p([]))
    assert math.isnan(sig.paired_t_p([0.4]))
    assert sig.paired_t_p([0.2, 0.2, 0.2]) == 0.0  # zero variance, non-zero mean: t = inf
    assert sig.paired_t_p([0.0, 0.0]) == 1.0  # zero variance on the null itself


@pytest.mark.parametrize("n", [2, 3, 6, 20])
def test_tost_matches_two_shifted_one_sided_scipy_tests(n):
    rng = np.random.default_rng(n)
    margin = 0.1
    for shift in (0.0, 0.05, -0.08, 0.3):
        d = rng.normal(shift, 0.05, size=n)
        result = sig.tost(d.tolist(), margin)
        lower = scipy_stats.ttest_1samp(d + margin, 0.0, alternative="greater").pvalue
        upper = scipy_stats.ttest_1samp(d - margin, 0.0, alternative="less").pvalue
        assert result.p_lower == pytest.approx(lower, rel=1e-9)
        assert result.p_upper == pytest.approx(upper, rel=1e-9)
        assert result.p == pytest.approx(max(lower, upper), rel=1e-9)
        assert result.equivalent == (max(lower, upper) < sig.ALPHA)
        assert result.n == n and result.mean == pytest.approx(d.mean())
        assert sig.tost_p(d.tolist(), margin) == result.p


def test_tost_equivalence_decisions_and_degenerate_cases():
    tight = [0.01, -0.01, 0.02, 0.0, -0.02, 0.01]
    assert sig.tost(tight, margin=0.1).equivalent
    assert not sig.tost([x + 0.2 for x in tight], margin=0.1).equivalent
    single = sig.tost([0.0], margin=0.1)
    assert math.isnan(single.p) and not single.equivalent and single.n == 1
    constant = sig.tost([0.05, 0.05, 0.05], margin=0.1)  # zero variance inside the margin
    assert (constant.p_lower, constant.p_upper, constant.equivalent) == (0.0, 0.0, True)
    outside = sig.tost([0.2, 0.2], margin=0.1)
    assert (outside.p_lower, outside.p_upper, outside.equivalent) == (0.0, 1.0, False)
    with pytest.raises(ValueError):
        sig.tost(tight, margin=0.0)


# --- Holm -------------------------------------------------------------------------------------

def holm_by_formula(p: list[float]) -> list[float]:
    # Independent closed form: the adjusted p of i is the largest (m − #{k: p_k < p_j}) · p_j
    # over every j with p_j <= p_i (capped at 1); ties share the larger multiplier.
    m = len(p)
    return [min(1.0, max((m - sum(pk < pj for pk in p)) * pj for pj in p if pj <= pi))
            for pi in p]


def holm_rejections_by_hand(p: list[float], alpha: float) -> list[bool]:
    # Holm (1979): walk up the sorted p-values, reject while p_(j) < alpha / (m − j + 1).
    m = len(p)
    reject = [False] * m
    for j, index in enumerate(sorted(range(m), key=p.__getitem__)):
        if not p[index] < alpha / (m - j):
            break
        reject[index] = True
    return reject


def test_holm_matches_the_closed_form_and_the_sequential_procedure():
    rng = np.random.default_rng(3)
    for _ in range(300):
        m = int(rng.integers(1, 12))
        # A mix of true effects (small p) and nulls (uniform p), as a report's family has.
        p = [float(x) for x in np.where(rng.uniform(size=m) < 0.4,
                                        rng.uniform(0, 0.02, size=m), rng.uniform(size=m))]
        adjusted = sig.holm(p)
        assert adjusted == pytest.approx(holm_by_formula(p), rel=1e-12)
        assert all(a >= q for a, q in zip(adjusted, p, strict=True)) and max(adjusted) <= 1.0
        ranked = sorted(zip(p, adjusted, strict=True))
        assert all(x[1] <= y[1] for x, y in itertools.pairwise(ranked))  # monotone
        for alpha in rng.uniform(0.001, 0.2, size=5):
            assert [a < alpha for a in adjusted] == holm_rejections_by_hand(p, float(alpha))


def test_holm_ties_nans_and_input_order():
    assert sig.holm([0.01, 0.01]) == [0.02, 0.02]
    assert sig.holm([0.04, 0.01, 0.03]) == pytest.approx([0.06, 0.03, 0.06])
    assert sig.holm([0.9, 0.8]) == [1.0, 1.0]  # 2 × 0.8 capped, then monotone
    assert sig.holm([]) == []
    with_nan = sig.holm([0.01, math.nan, 0.02])
    assert with_nan[0] == pytest.approx(0.03) and with_nan[2] == pytest.approx(0.04)
    assert math.isnan(with_nan[1])
    with pytest.raises(ValueError):
        sig.holm([1.5])


# --- Wilson and Fisher --------------------------------------------------------------------------

def test_wilson_matches_scipy_binomtest():
    for n in (1, 2, 3, 6, 10, 24, 100):
        for k in sorted({0, 1, n // 2, n - 1, n}):
            for confidence in (0.9, 0.95, 0.99):
                ci = scipy_stats.binomtest(k, n).proportion_ci(confidence, method="wilson")
                low, high = sig.wilson(k, n, confidence)
                assert low == pytest.approx(ci.low, abs=1e-12)
                assert high == pytest.approx(ci.high, abs=1e-12)
    with pytest.raises(ValueError):
        sig.wilson(3, 2)


def test_fisher_exact_matches_scipy_on_many_tables():
    rng = np.random.default_rng(4)
    tables = [(5, 6, 0, 24), (0, 6, 0, 6), (6, 6, 0, 6), (3, 6, 3, 6), (0, 0, 2, 5), (1, 9, 11, 14)]
    tables += [(int(rng.integers(0, an + 1)), an, int(rng.integers(0, bn + 1)), bn)
               for an, bn in rng.integers(0, 40, size=(400, 2))]
    for a, an, b, bn in tables:
        expected = scipy_stats.fisher_exact([[a, an - a], [b, bn - b]]).pvalue
        assert sig.fisher_exact_p(a, an, b, bn) == pytest.approx(expected, rel=1e-9), (a, an, b, bn)
    assert sig.fisher_exact_p(5, 6, 0, 24) < 1e-4  # five of six seeds failing against none of 24
    with pytest.raises(ValueError):
        sig.fisher_exact_p(7, 6, 0, 24)


def test_exact_trend_with_two_groups_is_the_hypergeometric_tail():
    """Two groups: T is the second group's count, whose law given the margins is
    hypergeometric; both tails against scipy's."""
    for k1, n1, k2, n2 in [(0, 6, 6, 6), (3, 6, 3, 6), (1, 12, 9, 12), (5, 18, 0, 18), (0, 4, 0, 4)]:
        total, events = n1 + n2, k1 + k2
        upper, lower = sig.exact_trend_p([(k1, n1), (k2, n2)])
        assert upper == pytest.approx(scipy_stats.hypergeom.sf(k2 - 1, total, events, n2))
        assert lower == pytest.approx(scipy_stats.hypergeom.cdf(k2, total, events, n2))


def test_exact_trend_matches_a_permutation_test_over_five_groups():
    """Five d_k of 12 runs: the exact tails against 200,000 random placements of the same
    events among the runs (within 4 standard errors of the Monte Carlo)."""
    rng = np.random.default_rng(5)
    for counts in ([0, 1, 3, 6, 9], [4, 2, 3, 1, 3], [0, 0, 0, 1, 0]):
        groups = [(k, 12) for k in counts]
        scores = np.repeat(np.arange(5), 12)  # (60,): each run's d_k rank
        events = np.zeros(60)
        events[:sum(counts)] = 1
        observed = sum(score * k for score, k in enumerate(counts))
        draws = np.array([scores @ rng.permutation(events) for _ in range(200_000)])
        upper, lower = sig.exact_trend_p(groups)
        for exact, sampled in ((upper, (draws >= observed).mean()),
                               (lower, (draws <= observed).mean())):
            se = math.sqrt(max(exact * (1 - exact), 1e-6) / len(draws))
            assert abs(exact - sampled) <= 4 * se, (counts, exact, sampled)
    with pytest.raises(ValueError):
        sig.exact_trend_p([(3, 2), (0, 4)])


def test_special_functions_at_and_past_their_domains_edges():
    # The tails at ±inf and nan, as scipy gives them.
    for t in (math.inf, -math.inf, math.nan):
        for df in (1, 5):
            expected = scipy_stats.t.sf(t, df)
            assert sig.t_sf(t, df) == pytest.approx(expected, nan_ok=True)
    for x in (-0.1, 1.5, math.nan):  # outside [0, 1]: scipy's betainc is nan there
        assert math.isnan(scipy_special.betainc(2.0, 3.0, x))
        with pytest.raises(ValueError, match="x must be in"):
            sig.regularized_beta(2.0, 3.0, x)
    for confidence in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="confidence must be in"):
            sig.wilson(1, 3, confidence)
    with pytest.raises(ValueError, match="need 0 <= successes <= n"):
        sig.wilson(4, 3)
