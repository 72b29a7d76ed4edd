"""The exponent claims (`analysis.exponent_claims`) where the data cannot decide them: too few
d_k, one seed, a c not run, no runs, a budget not measured; and what each claim says it tests.
The rows are test_exponent.py's exact parabolas, so which d_k and seeds exist is known."""

from __future__ import annotations

import pytest
from test_exponent import CS, synthetic_rows

from scale_ablation.analysis import exponent_claims as ec


def only(rows, d_ks):
    return [r for r in rows if r["d_k"] in d_ks]


def test_one_d_k_gives_no_slope_and_two_no_curvature():
    rows = synthetic_rows(0.0)
    one = ec.Exponent("fan_in").judge(only(rows, {16}))
    assert (one.verdict, one.reason) == ("inconclusive", "no interval for α (too few located c*, "
                                                         "d_k or seeds)")
    assert one.numbers[-1] == "fan_in: fewer than two d_k with a located c*: no slope"
    two = ec.OnePowerLaw("fan_in").judge(only(rows, {16, 32}))
    assert two.verdict == "inconclusive" and two.reason.startswith("fewer than three d_k")
    assert ec.OnePowerLaw("fan_in").judge(only(rows, {16, 32, 64})).verdict == "supported"


def test_the_scale_cost_without_the_data_to_measure_it():
    nothing = ec.ScaleCost("fan_in").judge([])
    assert (nothing.verdict, nothing.reason, nothing.numbers) == (
        "inconclusive", "no runs of the family", ())
    one_seed = ec.ScaleCost("fan_in").judge(only(synthetic_rows(0.0, seeds=(0,)), {16, 32}))
    assert one_seed.verdict == "inconclusive" and "at d_k [16, 32]" in one_seed.reason
    assert all("no tolerance (" in line for line in one_seed.numbers)
    # c = 1 not run (and so no 1/√d_k runs to measure the noise floor on): nothing to cost.
    without = [c for c in CS if c != 1.0]
    unrun = ec.ScaleCost("fan_in").judge(only(synthetic_rows(0.0, cs=without), {16}))
    assert unrun.verdict == "inconclusive" and "c = 1 was not run" in unrun.reason
    assert "noise floor" not in unrun.numbers[0] and "1/√d_k costs" not in unrun.numbers[0]


def test_the_shift_needs_both_budgets_located():
    rows = synthetic_rows(0.0)  # no early metric recorded
    shift = ec.ExponentShift("fan_in").judge(rows)
    assert shift.verdict == "inconclusive"
    assert shift.reason == "α is not located at both budgets on the same d_k"
    settled_late = ec.ExponentShift("fan_in").judge(synthetic_rows(0.0, early_k=0.0))
    assert settled_late.verdict == "supported"  # the same rows with the early metric


@pytest.mark.parametrize("claim, says", [
    (ec.Exponent("gpt2", expected=-1.0, d_k_range=(8, 64), steps=200),
     ["excludes −0.5 and 0", "within −1 ± 0.25", "over d_k 8–64", "runs of 200 steps",
      "init gpt2"]),
    (ec.Exponent("fan_in"), ["excludes −1 and 0", "within −0.5 ± 0.25", "init fan_in"]),
    (ec.OnePowerLaw("fan_in", margin=0.1), ["less than ±0.1", "init fan_in, final_val_bpb"]),
    (ec.ScaleCost("gpt2", c=2.0, margin=0.05), ["c = 2 (scale 2/√d_k) is within 0.05",
                                                "init gpt2"]),
    (ec.ExponentShift("fan_in"), [f"between {ec.EARLY_KEY} and final_val_bpb"]),
    (ec.ExponentShift("fan_in", budgets=(200, 1600)),
     ["between runs of 200 and of 1600 steps (final_val_bpb)"]),
])
def test_each_claim_says_what_it_tests(claim, says):
    text = claim.describe()
    assert all(part in text for part in says), text
    assert ("over d_k" in text) == (getattr(claim, "d_k_range", None) is not None)
