"""dk_exponent_regime: budgets run as runs of their own, each fitted on its own runs."""

from __future__ import annotations

import collections
import math
import statistics

import pytest
from helpers import REPO

from experiments import dk_exponent_regime as regime
from scale_ablation.analysis import exponent, exponent_claims
from scale_ablation.model import scale_family
from scale_ablation.records import study_store


def budget_rows(power_by_steps: dict[int, float]) -> list[dict]:
    """Noise-free rows of the cpu grid whose c* = d_k^power for runs of each budget, each C's
    best LR the middle of its grid."""
    rows = []
    for point in regime.sweep("cpu"):
        steps, d_k, init = point["train.steps"], point["model.qk_dim"], point["model.init"]
        c = scale_family.multiplier(point["policy"])
        star = d_k ** power_by_steps[steps]
        lr_star = sorted(regime.lrs_of("cpu", init, c, steps))[1]
        rows.append({"policy": point["policy"], "d_k": d_k, "lr": point["train.lr"],
                     "seed": point["train.seed"], "status": "completed",
                     "override:model.init": init,
                     "override:train.steps": steps,
                     "final_val_bpb": 2.5 + 0.05 * math.log(c / star) ** 2
                     + math.log10(point["train.lr"] / lr_star) ** 2 + 0.01 * point["train.seed"]})
    return rows


def test_every_d_k_is_at_most_a_quarter_of_the_width_and_budgets_are_8x_apart():
    config = regime.get_config("cpu")
    points = regime.sweep("cpu")
    assert max(p["model.qk_dim"] for p in points) <= config.model.d_model // 4
    assert config.model.num_heads >= 4
    short, long = sorted({p["train.steps"] for p in points})
    assert long == 8 * short
    for p in points:  # each run's schedule follows its own budget
        assert p["train.warmup_steps"] == p["train.steps"] // 20
        assert p["train.eval_every"] == p["train.steps"] // 2


def test_each_budget_is_fitted_on_its_own_runs():
    rows = budget_rows({200: -0.5, 1600: 0.0})  # α −1 at 200 steps, −1/2 at 1600
    short = exponent.fit(rows, "fan_in", steps=200, n_draws=20)
    long = exponent.fit(rows, "fan_in", steps=1600, n_draws=20)
    assert short.slope == pytest.approx(-0.5, abs=1e-9)
    assert long.slope == pytest.approx(0.0, abs=1e-9)
    shift = exponent_claims.ExponentShift("fan_in", budgets=(200, 1600)).judge(rows)
    assert shift.verdict == "contradicted", shift
    assert any("Δα = +0.500" in line for line in shift.numbers), shift.numbers


def test_the_long_runs_lrs_centre_on_the_200_step_bests_as_published():
    """LONG_LR_CENTRES recounted from the published 200-step runs: per (init, C), the LR with the
    lowest 3-seed mean final_val_bpb at each d_k, and of those the lower median over d_k."""
    store = REPO / "experiments" / "results" / "dk_exponent_regime_cpu" / study_store.STORE_FILE
    seeds = collections.defaultdict(list)  # (init, C, d_k, lr) -> final_val_bpb of each seed
    for run in study_store.read_store(str(store), metrics=False).runs:
        o = run.overrides
        if o["train.steps"] == 200 and run.summary["status"] == "completed":
            c = scale_family.multiplier(o["policy"])
            seeds[o["model.init"], c, o["model.qk_dim"], o["train.lr"]].append(
                run.summary["final_val_bpb"])
    best_at = collections.defaultdict(dict)  # (init, C) -> {d_k: (mean, lr)}
    for (init, c, d_k, lr), values in seeds.items():
        best_at[init, c][d_k] = min(best_at[init, c].get(d_k, (math.inf, 0.0)),
                                    (statistics.mean(values), lr))
    centres = {key: statistics.median_low(lr for _, lr in by_d_k.values())
               for key, by_d_k in best_at.items()}
    assert centres == {(i, c): lr for i, by_c in regime.LONG_LR_CENTRES.items()
                       for c, lr in by_c.items()}
    for point in regime.sweep("cpu"):  # and the 1,600-step runs use them, ×2 either side
        if point["train.steps"] == regime.LONG_STEPS:
            centre = regime.LONG_LR_CENTRES[point["model.init"]][
                scale_family.multiplier(point["policy"])]
            assert point["train.lr"] == pytest.approx(centre, rel=1e-5) or any(
                point["train.lr"] == pytest.approx(centre * f, rel=1e-5) for f in (0.5, 2))
