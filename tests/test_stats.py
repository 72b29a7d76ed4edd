"""`intervals` against scipy: t quantiles, confidence intervals, paired differences, decisions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from scale_ablation.analysis import intervals


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5, 6, 9, 10, 29, 30, 61])
def test_t_quantile_matches_scipy(df):
    for confidence in (0.5, 0.9, 0.95, 0.99):
        want = sps.t.ppf(0.5 + confidence / 2, df)
        assert intervals.t_quantile(df, confidence) == pytest.approx(want, rel=1e-9)


def test_mean_ci_matches_scipy_t_interval():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 12):
        values = rng.normal(3.0, 0.2, size=n)
        got = intervals.mean_ci(values)
        low, high = sps.t.interval(0.95, n - 1, loc=values.mean(), scale=sps.sem(values))
        assert got.n == n
        assert got.mean == pytest.approx(values.mean(), rel=1e-12)
        assert got.low == pytest.approx(low, rel=1e-9)
        assert got.high == pytest.approx(high, rel=1e-9)


def test_one_value_has_no_interval_and_says_n():
    got = intervals.mean_ci([2.5])
    assert got.half_width is None and got.n == 1
    assert got.format() == "2.500 (n=1)"
    assert intervals.decide(got) == intervals.TOO_FEW
    with pytest.raises(ValueError):
        intervals.mean_ci([])


def test_format_reads_mean_plus_minus_ci_and_n():
    got = intervals.mean_ci([1.0, 2.0, 3.0])
    half = sps.t.ppf(0.975, 2) * np.std([1.0, 2.0, 3.0], ddof=1) / np.sqrt(3)
    assert got.format(2) == f"2.00 ± {half:.2f} (n=3)"


def test_paired_matches_scipy_ttest_rel_interval():
    rng = np.random.default_rng(1)
    reference = rng.normal(3.0, 0.3, size=6)  # large seed-to-seed spread ...
    values = reference + 0.05 + rng.normal(0, 0.01, size=6)  # ... a small, consistent gap
    got = intervals.paired(values, reference)
    interval = sps.ttest_rel(values, reference).confidence_interval(0.95)
    assert got.low == pytest.approx(interval.low, rel=1e-9)
    assert got.high == pytest.approx(interval.high, rel=1e-9)
    # Pairing is what makes the gap visible: unpaired, the two intervals overlap.
    assert intervals.decide(got) == "worse"
    assert intervals.mean_ci(values).low < intervals.mean_ci(reference).high
    with pytest.raises(ValueError):
        intervals.paired([1.0], [1.0, 2.0])


def test_decide_by_sign_of_the_interval():
    lower = intervals.paired([1.0, 1.1, 0.9], [2.0, 2.05, 2.0])
    assert intervals.decide(lower) == "better"
    assert intervals.decide(lower, higher_is_better=True) == "worse"
    mixed = intervals.paired([1.0, 2.0, 1.5], [1.5, 1.4, 1.6])
    assert mixed.low < 0 < mixed.high
    assert intervals.decide(mixed) == intervals.UNRESOLVED


def test_no_degrees_of_freedom_no_quantile_and_str_is_the_default_format():
    for df in (0, -1):  # scipy's t.ppf is nan there: no interval can be formed
        assert np.isnan(sps.t.ppf(0.975, df))
        with pytest.raises(ValueError, match=f"degrees of freedom must be >= 1, got {df}"):
            intervals.t_quantile(df)
    got = intervals.mean_ci([1.0, 2.0, 3.0])
    half = sps.t.ppf(0.975, 2) * np.std([1.0, 2.0, 3.0], ddof=1) / np.sqrt(3)
    assert str(got) == f"2.000 ± {half:.3f} (n=3)"
    assert str(intervals.mean_ci([4.0])) == "4.000 (n=1)"
