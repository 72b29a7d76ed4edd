"""The counting rules where the runs cannot decide them or decide against them: `Counts`
(solved fractions, verdict_counts.Counting), `Diverges` (verdict_counts.Divergences) and
`Unstable` (verdict_unstable). Fisher's p-values from scipy, the rest by hand count.
(tests/test_claims_rules.py holds the decided cases and is at the 400-line limit.)"""

from __future__ import annotations

import pytest
from scipy import stats as sps
from test_claims_rules import row

from scale_ablation.analysis import claims as c
from scale_ablation.analysis import verdicts


def mqar(policy: str, seed: int, accuracy: float, lr: float = 1e-3) -> dict:
    return {**row(policy, 32, lr, seed, **{"final_val/accuracy": accuracy}), "task": "mqar"}


def judge(rule, rows):
    return verdicts.judge(c.Claim("x", rule), rows)


def test_counts_against_the_claim_too_few_to_tell_and_nothing_to_count():
    # none solves 6 of 6 against the reference's 0 of 6 (Fisher p = 0.0022): "worse" is refuted.
    rows = [mqar("inv_sqrt_dk", s, 0.1) for s in range(6)] + [mqar("none", s, 0.99)
                                                              for s in range(6)]
    assert sps.fisher_exact([[6, 0], [0, 6]]).pvalue < 0.05
    found = judge(c.Counts("worse", policies=("none",)), rows)
    assert (found.verdict, found.reason) == ("contradicted", "decided against the claim")
    # 2 of 3 against 1 of 3: Fisher p = 1, nothing resolved.
    few = [mqar("inv_sqrt_dk", s, v) for s, v in enumerate((0.99, 0.1, 0.1))]
    few += [mqar("none", s, v) for s, v in enumerate((0.99, 0.99, 0.1))]
    assert sps.fisher_exact([[2, 1], [1, 2]]).pvalue == pytest.approx(1.0)
    found = judge(c.Counts("better", policies=("none",)), few)
    assert (found.verdict, found.reason) == ("inconclusive", "not resolved by the counts")
    # No reference runs at the policy's d_k: no entry to count.
    alone = judge(c.Counts("better", policies=("none",)), [mqar("none", s, 0.99) for s in range(3)])
    assert (alone.verdict, alone.reason, alone.numbers) == ("inconclusive", "no runs to count", ())


def test_divergences_count_finished_runs_only_and_need_both_policies():
    rows = [row("none", 32, lr, s, status="diverged") for lr in (1e-3, 1e-2) for s in range(3)]
    # The reference never ran: nothing to count against.
    found = judge(c.Diverges("more", ("none",), "inv_sqrt_dk"), rows)
    assert (found.verdict, found.reason, found.numbers) == ("inconclusive", "no runs to count", ())
    # With it, a run that is still running or failed counts neither way.
    rows += [row("inv_sqrt_dk", 32, lr, s) for lr in (1e-3, 1e-2) for s in range(3)]
    rows += [row("none", 32, 1e-3, 3, status="running"), row("none", 32, 1e-3, 4, status="failed")]
    found = judge(c.Diverges("more", ("none",), "inv_sqrt_dk"), rows)
    p = sps.fisher_exact([[3, 0], [0, 3]]).pvalue  # 0.1 at each LR; Holm over the two: 0.2
    for number, lr in zip(found.numbers, ("0.001", "0.01"), strict=True):
        assert number == (f"none, d_k=32, lr={lr}: 3 of 3 diverged against inv_sqrt_dk 0 of 3; "
                          f"Fisher p = {p:.3g}, Holm {2 * p:.3g} → unresolved")


def test_unstable_without_runs_of_its_policies_and_a_smooth_run_that_barely_learns():
    found = judge(c.Unstable(("none",)), [row("inv_sqrt_dk", 32, 1e-3, s) for s in range(3)])
    assert (found.verdict, found.reason) == ("inconclusive", "no runs of these policies")
    # Smooth at its one LR, but its best run ends 0.1 bits per byte under the bigram line
    # (3.5 − 3.4), less than the 0.3 a run must learn beyond it.
    rows = [row("inv_sqrt_dk", 32, lr, s, final_val_bpb=3.4 + 0.01 * s, baseline_bigram_bpb=3.5)
            for lr in (1e-3, 1e-2) for s in range(3)]
    found = judge(c.Unstable(("inv_sqrt_dk",), expect_unstable=False), rows)
    assert "barely learns: its best run ends 0.10 bits per byte below the bigram line (less " \
           "than 0.3)" in found.numbers[0], found.numbers


@pytest.mark.parametrize("expect", ["same", "indistinguishable", "More"])
def test_diverges_refuses_an_expectation_it_cannot_count(expect):
    with pytest.raises(ValueError, match=rf"^Diverges\.expect must be more or fewer, got '{expect}'$"):
        c.Diverges(expect, ("none",), "inv_sqrt_dk")


def test_divergences_count_only_runs_that_ended():
    # verdicts.judge passes finished runs only; the rule itself also leaves the others out.
    from scale_ablation.analysis import verdict_counts

    rows = [row("none", 32, 1e-3, s, status="diverged") for s in range(2)]
    rows += [row("inv_sqrt_dk", 32, 1e-3, s) for s in range(2)]
    rows += [row("none", 32, 1e-3, 2, status="running"), row("inv_sqrt_dk", 32, 1e-3, 2,
                                                              status="failed")]
    counted = verdict_counts.Divergences(c.Diverges("more", ("none",), "inv_sqrt_dk"), rows)
    assert counted.entries == [("none", 32, 1e-3, (2, 2), (0, 2))]
