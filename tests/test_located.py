"""located.py's rule against optimum.py and exponent.py (independent code for the same point
estimates), its bounds, failed runs and bad input. Coverage: test_located_coverage.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scale_ablation.analysis import exponent, located, optimum


def noisy_curve(rng: np.random.Generator, lrs: list[float], n_seeds: int, noise: float,
                lr_star: float = 3e-3) -> dict[int, list[float]]:
    return {s: [2.0 + 0.3 * math.log(lr / lr_star) ** 2 + offset + rng.normal(0, noise)
                for lr in lrs] for s, offset in enumerate(rng.normal(0, noise, n_seeds))}


def test_the_point_estimate_is_optimum_pys_vertex():
    rng = np.random.default_rng(1)
    lrs = [1e-3 * 2**(k / 2) for k in range(7)]
    for trial in range(20):
        losses = noisy_curve(rng, lrs, 3, 0.03)
        old = optimum.fit_optimum(lrs, losses, n_boot=0)
        new = located.locate_curve(lrs, losses, n_draws=10, seed=trial)
        assert new.edge == old.edge and new.fitted == old.fitted
        assert new.star == pytest.approx(old.lr_star, rel=1e-9)
        assert new.log_ci[0] <= new.log_star <= new.log_ci[1]


def test_c_star_is_exponent_pys_with_each_c_at_its_best_lr():
    rng = np.random.default_rng(2)
    cs, lrs = [2.0**k for k in range(-3, 4)], [1e-3 * 2**k for k in range(4)]
    rows, grid = [], {}
    for c in cs:
        for lr in lrs:
            grid[c, lr] = {}
            for s in range(3):
                value = (2.0 + 0.05 * math.log(c / 0.7) ** 2 + 0.2 * math.log(lr / 3e-3) ** 2
                         + rng.normal(0, 0.03))
                grid[c, lr][s] = value
                rows.append({"policy": f"c_inv_sqrt_dk:{c!r}", "d_k": 16, "lr": lr, "seed": s,
                             "status": "completed", "final_val_bpb": value})
    curve = exponent.c_curves(rows, "fan_in")[16]
    old = exponent.locate(curve, n_boot=0)
    new = located.locate(grid, n_draws=10)
    assert new.star == pytest.approx(old.lr_star, rel=1e-9) and new.fitted == old.fitted
    assert new.nuisance_edge == exponent.lr_edge_near(curve, old)
    # Drop the lowest LR: every c's best LR (near 3e-3) stays interior, then sits on an edge.
    for low in (1e-3, 2e-3):
        cut = {p: v for p, v in grid.items() if p[1] > low}
        cut_rows = [r for r in rows if r["lr"] > low]
        curve = exponent.c_curves(cut_rows, "fan_in")[16]
        assert (located.locate(cut, n_draws=10).nuisance_edge
                == exponent.lr_edge_near(curve, exponent.locate(curve, n_boot=0)))


def test_noise_free_curves_give_the_point_and_edges_give_bounds():
    lrs = [1e-3 * 2**k for k in range(5)]
    exact = {s: [2.0 + s + 0.3 * math.log(lr / 3e-3) ** 2 for lr in lrs] for s in range(3)}
    found = located.locate_curve(lrs, exact)  # seed offsets only: no noise left
    assert found.df == 15 - 3 - 5 + 1 and found.bounded
    assert found.log_ci == pytest.approx((found.log_star,) * 2, abs=1e-9)
    rising = {s: [2.0 + s + 0.1 * k for k in range(5)] for s in range(3)}
    edge = located.locate_curve(lrs, rising)
    assert edge.edge == "low" and not edge.fitted and edge.log_ci[0] == -math.inf
    assert edge.star == pytest.approx(lrs[0])


def test_a_failed_run_is_never_the_best_nor_fitted_through():
    lrs = [1e-3 * 2**k for k in range(5)]
    losses = {s: [2.3, 2.1, 2.0, 2.05, 2.2] for s in range(3)}
    losses[1] = [2.3, 2.1, 2.0, None, 2.2]  # diverged beside the best
    found = located.locate_curve(lrs, losses, n_draws=200)
    assert found.best == (lrs[2],) and not found.fitted and found.star == pytest.approx(lrs[2])
    losses[1] = [2.3, 2.1, math.nan, 2.05, 2.2]  # diverged at the lowest mean
    assert located.locate_curve(lrs, losses, n_draws=200).best == (lrs[3],)


def test_the_slope_of_exact_optima_and_its_bounds():
    d_ks = (8, 16, 32, 64)
    optima = {}
    for i, d in enumerate(d_ks):
        log_star = math.log(0.5) - 0.4 * math.log(d)
        cs = [math.exp(log_star + math.log(2) * (k - 3.3)) for k in range(7)]  # c* off-grid
        grid = {(c, 1e-3): {s: 2.0 + s + 0.05 * (math.log(c) - log_star) ** 2
                            + 1e-4 * ((i + s + k) % 3) for s in range(3)}
                for k, c in enumerate(cs)}
        optima[d] = located.locate(grid, seed=[0, d])
    slope = located.fit_slope(optima)
    assert slope.slope == pytest.approx(-0.4, abs=0.02)
    assert slope.ci[0] <= slope.slope <= slope.ci[1] and slope.ci[1] - slope.ci[0] < 0.1
    # Order statistics, each end from its own side's values; infinite ends stay infinite.
    draws = np.array([0.4, 0.1, 0.3, 0.2, 0.5])
    assert located.interval(draws, draws, 0.6) == (0.2, 0.4)
    assert located.interval(np.r_[-np.inf, draws[1:]], np.r_[np.inf, draws[1:]], 0.99) == (
        -np.inf, np.inf)


@pytest.mark.parametrize(("xs", "losses", "says"), [
    ([1e-3, 2e-3, 4e-3], {0: [2.1, 2.0, 2.1]}, "degrees of freedom"),
    ([1e-3, 2e-3, 4e-3], {0: [2.1, 2.0], 1: [2.1, 2.0]}, "2 losses for 3"),
    ([0.0, 2e-3, 4e-3], {0: [2.1, 2.0, 2.1], 1: [2.1, 2.0, 2.1]}, "positive"),
    ([1e-3, 2e-3], {0: [None, None], 1: [2.0, 2.1]}, "no grid point"),
])
def test_bad_input_says_what_is_wrong(xs, losses, says):
    with pytest.raises(ValueError, match=says):
        located.locate_curve(xs, losses)


def test_grids_that_are_not_one_or_two_axes_and_too_few_d_k_are_refused():
    run = {0: 2.0, 1: 2.1}
    for grid, says in (({}, "at least one grid point"),
                       ({(1.0,): run, (1.0, 2.0): run}, "one coordinate or all two"),
                       ({(1.0, 2.0, 3.0): run, (2.0, 2.0, 3.0): run}, "one coordinate or all two")):
        with pytest.raises(ValueError, match=says):
            located.locate(grid)
    lrs = [1e-3 * 2**k for k in range(5)]
    one = located.locate_curve(lrs, noisy_curve(np.random.default_rng(3), lrs, 3, 0.01))
    with pytest.raises(ValueError, match="need at least two d_k for a slope, got 1"):
        located.fit_slope({8: one})
    with pytest.raises(ValueError, match="need at least three d_k for a curvature, got 2"):
        located.fit_curve({8: one, 16: one})


def test_a_c_whose_every_run_failed_takes_no_part_in_the_lr_edge_judgement():
    cs, lrs = [0.5, 1.0, 2.0, 4.0], [1e-3, 2e-3, 4e-3]
    grid = {(c, lr): {s: 2.0 + 0.05 * math.log(c) ** 2 + 0.2 * math.log(lr / 2e-3) ** 2
                      + 0.01 * s + 1e-4 * ((k + s) % 3) for s in range(3)}
            for k, (c, lr) in enumerate((c, lr) for c in cs for lr in lrs)}
    grid.update({(2.0, lr): {s: None for s in range(3)} for lr in lrs})  # c = 2: all diverged
    found = located.locate(grid, n_draws=20)
    # By hand: the best c is 1; of its neighbours c = 0.5 took its best LR (2e-3) inside its LR
    # grid and c = 2 has no finished LR, so no LR edge is near.
    assert found.best == (1.0, 2e-3) and not found.nuisance_edge
    # The same with c = 2's runs finished at the LR grid's edge only: now an LR edge is near.
    grid.update({(2.0, lr): {s: (None if lr < 4e-3 else 2.5 + 0.01 * s) for s in range(3)}
                 for lr in lrs})
    assert located.locate(grid, n_draws=20).nuisance_edge


def test_c_grids_read_the_family_only():
    rows = [{"policy": policy, "d_k": 16, "lr": 1e-3, "seed": 0, "status": "completed",
             "final_val_bpb": value}
            for policy, value in (("c_inv_sqrt_dk:2", 2.5), ("inv_sqrt_dk", 2.4), ("inv_dk", 2.3))]
    # inv_sqrt_dk is c = 1; inv_dk is not c·d_k^(-1/2) and is left out.
    assert located.c_grids(rows, "final_val_bpb") == {16: {(2.0, 1e-3): {0: 2.5},
                                                           (1.0, 1e-3): {0: 2.4}}}
