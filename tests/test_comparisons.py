"""The report's comparisons (`analysis.comparisons`) and tables (`analysis.tables`) where the
runs do not line up: seeds that ran different LRs, a policy with a seed the reference never ran,
no step-0 evaluation, a best-LR table without located curves. Expected values by hand and by
scipy; the report's own synthetic sweeps (test_report*.py) cover the aligned case."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats as sps

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import tables


def run(policy: str, lr: float, seed: int, bpb: float, **fields) -> dict:
    return {"name": f"{policy},{lr},{seed}", "policy": policy, "d_k": 32, "lr": lr, "seed": seed,
            "status": "completed", "final_val_bpb": bpb, "final_val_loss": bpb * math.log(2),
            **fields}


def test_seeds_that_ran_different_lrs_give_a_curve_but_no_per_seed_sensitivity():
    # Seed 0 ran LR 1e-3 only, seed 1 LR 1e-2 only: the setting's curve has both LRs, no seed has.
    rows = [run("p", 1e-3, 0, 3.0, initial_val_loss=4.0), run("p", 1e-2, 1, 2.6,
                                                               initial_val_loss=4.2)]
    losses = [3.0 * math.log(2), 2.6 * math.log(2)]  # each below the initial loss (4.1 nats)
    expected = statistics.fmean(losses) - min(losses)  # Wortsman et al.: mean less the best
    assert cmp.lr_sensitivity(rows) == {"p d_k=32": pytest.approx(expected)}
    assert cmp.lr_sensitivity_by_seed(rows) == {}
    lines = tables.sensitivity_tables(rows, "p")
    assert f"| p d_k=32 | {expected:.4f} |" in lines
    assert not any(line.startswith("Per seed") for line in lines)


def test_without_a_step_0_evaluation_there_is_no_sensitivity_at_all():
    rows = [run("p", lr, seed, 3.0 + seed / 10) for lr in (1e-3, 1e-2) for seed in (0, 1)]
    assert cmp.lr_sensitivity(rows) == {} and cmp.lr_sensitivity_by_seed(rows) == {}


def test_a_seed_the_reference_never_ran_is_left_out_of_the_pairs():
    gap = {0: 0.05, 1: 0.07, 2: -1.0}  # q's own difference per seed; seed 2's would flip it
    rows = [run(policy, lr, seed, value + seed * 0.1 + (gap[seed] if policy == "q" else 0.0))
            for policy, seeds in (("ref", (0, 1)), ("q", (0, 1, 2)))
            for lr, value in ((1e-3, 3.0), (3e-3, 2.8), (1e-2, 2.9)) for seed in seeds]
    best = cmp.best_lrs(rows, "final_val_bpb", False)
    assert {(b.policy, b.lr) for b in best} == {("ref", 3e-3), ("q", 3e-3)}
    (pair,) = cmp.paired_best_lr(best, "ref", "final_val_bpb", False)
    # Seeds 0 and 1 pair at LR 3e-3; seed 2 has no reference run and is not paired.
    assert pair.differences == pytest.approx((0.05, 0.07))
    interval = sps.ttest_rel([2.85, 2.97], [2.8, 2.9]).confidence_interval(0.95)
    assert (pair.difference.low, pair.difference.high) == pytest.approx(
        (interval.low, interval.high))


def test_a_best_lr_row_without_a_located_curve_has_no_note():
    rows = [run("p", lr, seed, value + seed / 100)
            for lr, value in ((1e-3, 3.0), (3e-3, 2.8), (1e-2, 2.9)) for seed in (0, 1)]
    (best,) = cmp.best_lrs(rows, "final_val_bpb", False)
    (line,) = [row for row in tables.best_lr_table(rows, [best], "final_val_bpb")
               if row.startswith("| p |")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:5] == ["—", "0.003", "—"]  # no located LR, the grid's best, no bracket
    assert cells[-1] == "" and cells[6] == best.estimate.format()
