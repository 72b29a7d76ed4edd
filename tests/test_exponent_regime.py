"""dk_exponent_regime: budgets run as runs of their own, each fitted on its own runs."""

from __future__ import annotations

import math

import pytest

from experiments import dk_exponent_regime as regime
from scale_ablation.analysis import exponent, exponent_claims
from scale_ablation.model import scale_family

LR_STAR = 2e-3


def budget_rows(power_by_steps: dict[int, float]) -> list[dict]:
    """Noise-free rows of the cpu grid whose c* = d_k^power for runs of each budget."""
    rows = []
    for point in regime.sweep("cpu"):
        steps, d_k = point["train.steps"], point["model.qk_dim"]
        c = scale_family.multiplier(point["policy"])
        star = d_k ** power_by_steps[steps]
        rows.append({"policy": point["policy"], "d_k": d_k, "lr": point["train.lr"],
                     "seed": point["train.seed"], "status": "completed",
                     "override:model.init": point["model.init"],
                     "override:train.steps": steps,
                     "final_val_bpb": 2.5 + 0.05 * math.log(c / star) ** 2
                     + math.log10(point["train.lr"] / LR_STAR) ** 2 + 0.01 * point["train.seed"]})
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
