"""The exponent fit (`analysis.exponent`) on synthetic rows whose best c is known: c* = c0·d_k^k,
so the slope of log c* on log d_k is k and α = k − 1/2. The losses are exact parabolas in log c
and log lr (plus seed noise), so the located c* are checked against the true ones, the slope
against scipy.stats.linregress and numpy's polyfit, and the verdicts against the known α."""

from __future__ import annotations

import itertools
import math
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments import dk_exponent
from scale_ablation.analysis import exponent, exponent_claims, exponent_plots, optimum
from scale_ablation.analysis import plot_style as look
from scale_ablation.analysis.verdicts import judge_family
from scale_ablation.model import policies, scale_family

REPO = pathlib.Path(__file__).resolve().parents[1]
D_KS = (8, 16, 32, 64, 128, 256)
CS = tuple(2.0**k for k in range(-5, 6))  # wide enough to bracket c* for k in [-1/2, 1/2]
LRS = (2.5e-3, 5e-3, 1e-2)
LR_STAR = 5e-3


def synthetic_rows(k: float, *, c0: float = 1.0, seeds=(0, 1, 2), noise: float = 0.0,
                   init: str = "fan_in", key: str = "final_val_bpb", cs=CS,
                   early_k: float | None = None, rng_seed: int = 0) -> list[dict]:
    """One row per (d_k, c, lr, seed): loss = 2.5 + 0.05·ln²(c/c*) + log10²(lr/lr*) + noise,
    with c* = c0·d_k^k; the early key has its own exponent `early_k`."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for d_k in D_KS:
        for c in cs:
            for lr in LRS:
                for seed in seeds:
                    row = {"policy": dk_exponent.policy_of(c), "d_k": d_k, "lr": lr,
                           "seed": seed, "status": "completed",
                           "override:model.init": init, "baseline_bigram_bpb": 3.6,
                           "baseline_unigram_bpb": 4.9}
                    for name, power in ((key, k), (exponent_claims.EARLY_KEY, early_k)):
                        if power is None:
                            continue
                        star = c0 * d_k**power
                        row[name] = (2.5 + 0.05 * math.log(c / star) ** 2
                                     + 1.0 * math.log10(lr / LR_STAR) ** 2
                                     + noise * rng.standard_normal())
                    rows.append(row)
    return rows


def test_the_family_is_c_over_sqrt_dk_and_shares_one_program():
    for c in (0.25, 3.0):
        policy = policies.get(f"c_inv_sqrt_dk:{c:g}")
        assert policy.base_scale(64) == pytest.approx(c / 8)
        assert policy == policies.get("inv_sqrt_dk") == policies.get("const:0.1")
    assert scale_family.multiplier("inv_sqrt_dk") == 1.0
    assert scale_family.multiplier("c_inv_sqrt_dk:0.5") == 0.5
    assert scale_family.multiplier("inv_dk") is None
    with pytest.raises(ValueError, match="c_inv_sqrt_dk"):
        policies.get("c_inv_sqrt_dk:-1")


@pytest.mark.parametrize("k", [0.0, -0.5, 0.5, 0.3])
def test_noise_free_c_star_and_slope_are_exact(k):
    rows = synthetic_rows(k, c0=1.3)
    found = exponent.fit(rows, "fan_in", n_draws=20)
    for d_k, o in found.optima.items():
        # An exact parabola in log c: its vertex through any three points is the true c*.
        assert o.star == pytest.approx(1.3 * d_k**k, rel=1e-9)
    assert not found.unsettled
    assert found.slope == pytest.approx(k, abs=1e-9)
    assert found.alpha == pytest.approx(k - 0.5, abs=1e-9)


def test_each_c_is_taken_at_its_own_best_lr():
    curve = exponent.c_curves(synthetic_rows(0.0), "fan_in")[32]
    assert set(curve.best_lrs) == {LR_STAR}
    assert not any(curve.lr_edges)


def test_slope_matches_scipy_linregress_and_the_curve_numpy_polyfit():
    rows = synthetic_rows(0.2, noise=0.01, rng_seed=3)
    found = exponent.fit(rows, "fan_in", n_draws=400)
    d_ks = found.settled
    log_c = np.log([found.optima[d].star for d in d_ks])
    reference = scipy_stats.linregress(np.log(d_ks), log_c)
    assert found.slope == pytest.approx(reference.slope, rel=1e-9)
    assert found.slope_ci[0] < found.slope < found.slope_ci[1]
    curve = found.curve()
    x = np.log(d_ks)
    quadratic = np.polyfit(x - x.mean(), log_c, 2)  # highest power first
    assert curve.curvature == pytest.approx(quadratic[0], rel=1e-6, abs=1e-9)
    for d_k, (local, ci) in curve.local_slopes.items():
        expected = quadratic[1] + 2 * quadratic[0] * (math.log(d_k) - x.mean())
        assert local == pytest.approx(expected, rel=1e-6, abs=1e-9)
        assert ci[0] <= local <= ci[1]


def test_the_interval_covers_the_true_slope_and_curvature_in_most_trials():
    """Coverage is measured at scale in test_located_coverage.py; here a smoke check that the
    exponent's own wiring (rows -> grids -> draws) keeps it."""
    covered_slope = covered_curvature = 0
    trials = 20
    for trial in range(trials):
        found = exponent.fit(synthetic_rows(0.0, noise=0.01, rng_seed=100 + trial), "fan_in",
                             n_draws=400, seed=trial)
        low, high = found.slope_ci
        covered_slope += low <= 0.0 <= high
        low, high = found.curve().curvature_ci
        covered_curvature += low <= 0.0 <= high
    assert covered_slope >= 0.8 * trials, covered_slope
    assert covered_curvature >= 0.8 * trials, covered_curvature


def test_one_power_law_and_the_scale_cost_rules():
    """A straight log c* passes OnePowerLaw, a strongly bent one fails it; 1/√d_k at the true
    optimum (k = 0, c0 = 1) costs nothing, while c* = 1/8 puts it 0.05·ln²8 = 0.22 above."""
    assert exponent_claims.OnePowerLaw("fan_in").judge(synthetic_rows(0.0, noise=0.003)).verdict \
        == "supported"
    bent = synthetic_rows(0.0, noise=0.003)
    for row in bent:  # c* = d_k^(0.5·(ln d_k − ln 32)): curvature 0.5 in ln d_k
        star = math.exp(0.5 * (math.log(row["d_k"]) - math.log(32)) ** 2)
        c = scale_family.multiplier(row["policy"])
        row["final_val_bpb"] = (2.5 + 0.05 * math.log(c / star) ** 2
                                + math.log10(row["lr"] / LR_STAR) ** 2)
    assert exponent_claims.OnePowerLaw("fan_in").judge(bent).verdict == "contradicted"
    assert exponent_claims.ScaleCost("fan_in").judge(synthetic_rows(0.0, noise=0.003)).verdict \
        == "supported"
    far = exponent_claims.ScaleCost("fan_in").judge(synthetic_rows(0.0, c0=1 / 8, noise=0.003))
    assert far.verdict == "contradicted", far
    assert any("1/√d_k costs 0.216" in line for line in far.numbers), far.numbers


@pytest.mark.parametrize(("k", "expected", "verdict"), [
    (0.0, -0.5, "supported"), (-0.5, -0.5, "contradicted"), (0.5, -0.5, "contradicted"),
    (-0.5, -1.0, "supported"), (0.0, -1.0, "contradicted")])  # α = k − 1/2
def test_the_exponent_rule_on_known_exponents(k, expected, verdict):
    rows = synthetic_rows(k, noise=0.003)
    result = exponent_claims.Exponent("fan_in", expected=expected).judge(rows)
    assert result.verdict == verdict, result
    assert any("α =" in line for line in result.numbers)


def test_an_interval_holding_another_candidate_is_no_support(monkeypatch):
    """Inside the band is not enough: the CI must also exclude the other candidates. A band
    widened to ±0.6 around −1 reaches −1/2, so an interval can be inside it and hold −1/2."""
    found = types.SimpleNamespace(alpha_ci=(-1.3, -0.45), unsettled={})
    monkeypatch.setattr(exponent, "fit", lambda *args, **kwargs: found)
    monkeypatch.setattr(exponent_claims, "fit_lines", lambda *args: [])
    wide = exponent_claims.Exponent("fan_in", expected=-1.0, margin=0.6)  # the band: [−1.6, −0.4]
    assert wide.judge([]).verdict == "inconclusive"  # holds −1/2
    found.alpha_ci = (-1.3, -0.55)
    assert wide.judge([]).verdict == "supported"


def test_a_c_star_beyond_the_grid_is_a_bound_and_names_the_next_c():
    rows = synthetic_rows(0.0, c0=8.0, cs=(0.5, 1.0, 2.0, 4.0))  # c* = 8: above the grid
    found = exponent.fit(rows, "fan_in", n_draws=10)
    assert set(found.unsettled) == set(D_KS)
    assert optimum.refine_points((0.5, 1.0, 2.0, 4.0), [3.0, 2.0, 1.0, 0.5]) == [8.0]
    assert "run c = 8" in found.unsettled[8]
    assert exponent_claims.Exponent("fan_in").judge(rows).verdict == "inconclusive"


def c_row(c: float, lr: float, seed: int, value: float | None, d_k: int = 16) -> dict:
    return {"policy": dk_exponent.policy_of(c), "d_k": d_k, "lr": lr, "seed": seed,
            "status": "completed" if value is not None else "diverged", "final_val_bpb": value}


def test_c_curves_keep_only_the_cs_and_d_k_that_have_a_point():
    bowl = lambda c, lr, s: (2.5 + 0.05 * math.log(c) ** 2  # noqa: E731
                             + math.log10(lr / LR_STAR) ** 2 + 0.01 * s)
    rows = [c_row(c, lr, s, bowl(c, lr, s)) for c in (0.5, 1.0, 2.0) for lr in LRS for s in (0, 1)]
    rows += [c_row(4.0, lr, s, None) for lr in LRS for s in (0, 1)]  # c = 4: all diverged
    rows += [c_row(8.0, LRS[0], 0, 2.6), c_row(8.0, LRS[1], 1, 2.6)]  # no LR ran both seeds
    rows += [{**c_row(1.0, lr, s, 9.9), "policy": "inv_dk"} for lr in LRS for s in (0, 1)]
    rows += [c_row(1.0, lr, s, bowl(1.0, lr, s), d_k=32) for lr in LRS for s in (0, 1)]  # one c
    curves = exponent.c_curves(rows, "fan_in")
    assert list(curves) == [16]  # d_k 32 has one c: no curve
    curve = curves[16]
    assert curve.cs == (0.5, 1.0, 2.0) and curve.best_lrs == (LR_STAR,) * 3
    assert curve.lr_edges == (False,) * 3  # LR_STAR is the middle LR
    for s in (0, 1):  # inv_dk's 9.9 (not c·d_k^(-1/2)) is never read
        assert curve.losses_by_seed[s] == pytest.approx([bowl(c, LR_STAR, s) for c in curve.cs])
    # A curve whose every c ran one LR, and diverged there: no c* to locate.
    failed = exponent.c_curves([c_row(c, LRS[0], s, None) for c in (0.5, 1.0) for s in (0, 1)],
                               "fan_in")
    assert failed[16].lr_edges == (True, True) and exponent.locate(failed[16]) is None


def test_a_best_lr_on_its_lr_grids_edge_leaves_c_star_unsettled():
    rows = [r for r in synthetic_rows(0.0) if r["lr"] >= LR_STAR]  # LR_STAR is now the lowest
    found = exponent.fit(rows, "fan_in", n_draws=10)
    assert found.unsettled == {
        d: "the best c or a neighbour took its LR from its LR grid's edge" for d in D_KS}
    assert found.slope is None and found.settled == []


def test_ols_matches_scipy_and_has_no_error_below_three_points():
    x, y = np.log([8.0, 16.0, 32.0, 64.0]), np.array([0.1, 0.45, 0.7, 1.2])
    fit = scipy_stats.linregress(x, y)
    assert exponent.ols(x, y) == pytest.approx((fit.slope, fit.intercept, fit.stderr))
    two = scipy_stats.linregress(x[:2], y[:2])
    slope, intercept, error = exponent.ols(x[:2], y[:2])
    assert (slope, intercept) == pytest.approx((two.slope, two.intercept)) and error is None


def test_one_seed_leaves_the_exponent_inconclusive():
    rows = synthetic_rows(0.0, seeds=(0,))
    assert exponent_claims.Exponent("fan_in").judge(rows).verdict == "inconclusive"


@pytest.mark.parametrize(("early_k", "verdict"), [(0.0, "supported"), (-0.5, "contradicted")])
def test_the_shift_rule_compares_alpha_at_two_budgets(early_k, verdict):
    rows = synthetic_rows(0.0, early_k=early_k, noise=0.003)
    result = exponent_claims.ExponentShift("fan_in").judge(rows)
    assert result.verdict == verdict, result


def test_the_rules_are_judged_in_the_study_family_by_themselves():
    rows = synthetic_rows(0.0, noise=0.003, early_k=0.0)
    verdicts = judge_family([c for c in dk_exponent.claims("cpu") if "fan_in" in c.text], rows)
    # α = −1/2 exactly: in each d_k range 1/√d_k supported and μP's 1/d_k contradicted; one
    # power law; 1/√d_k costs nothing; α the same early and late.
    assert [v.verdict for v in verdicts] == ["supported", "contradicted"] * 2 + ["supported"] * 3


def test_an_init_is_fitted_on_its_own_rows():
    rows = synthetic_rows(0.0, init="fan_in") + synthetic_rows(0.5, init="gpt2")
    assert exponent.fit(rows, "fan_in", n_draws=10).slope == pytest.approx(0.0, abs=1e-9)
    assert exponent.fit(rows, "gpt2", n_draws=10).slope == pytest.approx(0.5, abs=1e-9)


def test_the_experiment_grid_is_the_design():
    points = dk_exponent.sweep("cpu")
    qk = sorted({p["model.qk_dim"] for p in points})
    assert len(qk) >= 5 and qk[0] == 8 and qk[-1] == 256
    cs = sorted({scale_family.multiplier(p["policy"]) for p in points})
    assert all(b / a == 2 for a, b in itertools.pairwise(cs))
    assert {p["model.init"] for p in points} == {"fan_in", "gpt2"}
    assert len({p["train.seed"] for p in points}) >= 3
    assert len({p["train.lr"] for p in points}) >= 3
    config = dk_exponent.get_config("cpu")
    assert config.model.num_heads >= 4
    assert config.model.head_dim * config.model.num_heads == config.model.d_model
    assert (config.train.steps // 2) % config.train.eval_every == 0  # the halfway evaluation


def test_figures_are_drawn_from_synthetic_rows(tmp_path):
    rows = synthetic_rows(0.0, noise=0.003) + synthetic_rows(-0.5, noise=0.003, init="gpt2")
    figures = exponent_plots.figures(rows)
    assert set(figures) == {"loss_vs_c.png", "c_star_vs_dk.png"}
    for name, fig in figures.items():
        look.save(fig, str(tmp_path / name))
        assert (tmp_path / name).stat().st_size > 10_000
    assert exponent_plots.figures(synthetic_rows(0.0, cs=(1.0,))) == {}


def test_loss_vs_c_dashes_the_c_stars_the_claims_do_not_count():
    """c* = 1.5/√d_k on the grid 1/4…4: the best grid c is the low edge from d_k 32 up (a bound,
    dashed), interior at 8 and 16 (solid), reckoned here from the truth, not from the fit."""
    cs = tuple(2.0**k for k in range(-2, 3))
    rows = synthetic_rows(-0.5, c0=1.5, cs=cs)
    fig = exponent_plots.plot_loss_vs_c(rows)
    styles = {}
    for ax in fig.axes:
        if not ax.get_title().startswith("d_k = "):
            continue
        verticals = [line for line in ax.get_lines()
                     if len(line.get_xdata()) == 2 and line.get_xdata()[0] == line.get_xdata()[1]]
        assert len(verticals) == 1
        styles[int(ax.get_title().removeprefix("d_k = "))] = verticals[0].get_linestyle()
    for d_k in D_KS:
        best = min(cs, key=lambda c, d_k=d_k: abs(math.log(c / (1.5 / math.sqrt(d_k)))))
        assert styles[d_k] == ("--" if best in (cs[0], cs[-1]) else "-"), d_k


def test_the_c_star_figure_titles_the_claims_interval():
    """Each panel's α interval is the one the claim judges (`exponent.fit` at its defaults), not
    a cheaper bootstrap's: a figure and claims.md beside it must not print two intervals."""
    rows = synthetic_rows(0.0) + synthetic_rows(-0.5, init="gpt2")
    # Each seed's c* off the line by a factor e^(±1/2) or 1, in an order that changes with d_k:
    # the seeds' mean vertex stays on the line (the t interval is a point), their spread is what
    # the bootstrap sees, so its resample count shows in the interval.
    rng = np.random.default_rng(3)
    offsets = {d_k: dict(zip((0, 1, 2), rng.permutation((-0.5, 0.0, 0.5)), strict=True))
               for d_k in D_KS}
    for row in rows:
        k = 0.0 if row["override:model.init"] == "fan_in" else -0.5
        log_star = k * math.log(row["d_k"]) + offsets[row["d_k"]][row["seed"]]
        c = scale_family.multiplier(row["policy"])
        row["final_val_bpb"] = (2.5 + 0.05 * (math.log(c) - log_star) ** 2
                                + math.log10(row["lr"] / LR_STAR) ** 2)
    fig = exponent_plots.plot_c_star(rows)
    for ax, init in zip(fig.axes, ("fan_in", "gpt2"), strict=False):
        found = exponent.fit(rows, init)
        low, high = found.alpha_ci
        interval = (f"[{low:+.2f}, {high:+.2f}]" if math.isfinite(low) and math.isfinite(high)
                    else "CI past the grid")  # an end beyond the c grid: no number to print
        assert ax.get_title() == f"{init} init: α = {found.alpha:+.2f} {interval}"


@pytest.mark.slow  # minutes on 2 cores: `-m slow`
def test_quick_sweep_runs_end_to_end_and_reports_the_exponent(tmp_path):
    """The quick grid trains (q/k width apart from v, every C of a d_k in one ensemble), its
    rows carry d_k = qk_dim and the halfway evaluation, and the report draws and judges it."""
    result = subprocess.run([sys.executable, "-m", "scale_ablation.sweep",
                             f"--config={REPO}/experiments/dk_exponent.py:quick",
                             f"--workdir={tmp_path}"], capture_output=True, text=True, cwd=REPO,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ensemble of" in result.stdout
    from scale_ablation import report
    rows = [report.summarise_run(run) for run in report.load_runs(str(tmp_path))]
    assert len(rows) == len(dk_exponent.sweep("quick"))
    assert {r["d_k"] for r in rows} == {8, 32}
    assert all(r["status"] == "completed" and r[exponent_claims.EARLY_KEY] is not None for r in rows)
    assert all(r["final_logit_std"] is not None for r in rows)
    assert {8, 32} == set(exponent.c_curves(rows, "fan_in"))
    out = tmp_path / "report"
    assert (out / "loss_vs_c.png").exists() and (out / "c_star_vs_dk.png").exists()
    claims_md = (out / "claims.md").read_text()
    assert "The optimal scale is ∝ d_k^(−1/2) (fan_in init)" in claims_md


def test_a_d_k_that_ran_one_c_is_unsettled_and_says_so():
    """A d_k where one c of the family ran (c = 1 at d_k 32 beside a full grid at 16) has no
    curve over c: its c* is no location, and naming 'the next c to run' needs two c. Before
    the fix, `exponent.fit` raised IndexError here (why_unsettled read the grid's second c)."""
    rows = [r for r in synthetic_rows(0.0) if r["d_k"] == 16 or
            (r["d_k"] == 32 and r["policy"] == "inv_sqrt_dk")]
    found = exponent.fit(rows, "fan_in", n_draws=10)
    assert found.unsettled == {32: "only c = 1 was run at this d_k"}
    assert found.settled == [16] and found.slope is None
    assert exponent_claims.Exponent("fan_in").judge(rows).verdict == "inconclusive"


def test_a_c_star_past_the_top_c_of_8_is_drawn_at_8():
    """c* = 16 past the grid 1…8: every d_k's c* is the top c, a bound. located.py keys the c by
    their logs rounded to 9 digits, and ln 8 rounds up, so the bound sat 1e-9 past the grid
    value its interval is clipped to: before the fix, matplotlib refused the negative error bar
    (ValueError) and the report's c* figure was lost."""
    rows = synthetic_rows(0.0, c0=16.0, cs=(1.0, 2.0, 4.0, 8.0), noise=0.003)
    figure = exponent_plots.figures(rows)["c_star_vs_dk.png"]
    (ax,) = figure.axes
    (points,) = [line for line in ax.lines if line.get_marker() == "o"]
    assert list(points.get_xdata()) == list(D_KS)
    np.testing.assert_allclose(np.asarray(points.get_ydata(), float), 8.0, rtol=1e-6)


def test_figures_with_a_d_k_of_one_seed_draw_what_can_be_located():
    """d_k 16 with three seeds (c* = 1 exactly), d_k 32 with one: no noise estimate there, so
    no c*, no tolerance bar, no slope; two d_k make one row of panels."""
    rows = ([r for r in synthetic_rows(0.0) if r["d_k"] == 16]
            + [r for r in synthetic_rows(0.0, seeds=(0,)) if r["d_k"] == 32])
    figures = exponent_plots.figures(rows)
    loss = {ax.get_title(): ax for ax in figures["loss_vs_c.png"].axes}
    assert set(loss) == {"d_k = 16", "d_k = 32"}
    vertical = lambda ax: [line.get_xdata()[0] for line in ax.lines  # noqa: E731
                           if len(set(line.get_xdata())) == 1 and len(line.get_xdata()) == 2]
    assert vertical(loss["d_k = 16"]) == [pytest.approx(1.0)] and vertical(loss["d_k = 32"]) == []
    (c_star,) = figures["c_star_vs_dk.png"].axes
    assert c_star.get_title() == "fan_in init: no fit"
    assert [list(line.get_xdata()) for line in c_star.lines if line.get_linewidth() == 6] == [
        [16, 16]]  # the tolerance bar of d_k 16 only
    # With one seed everywhere no d_k has a c*: no c* figure at all.
    assert exponent_plots.plot_c_star(synthetic_rows(0.0, seeds=(0,))) is None
    # Two c, but never two at one d_k: no curve over c to draw; each d_k's one c is a bound.
    apart = [r for r in synthetic_rows(0.0) if (r["d_k"], r["policy"]) in
             ((16, "inv_sqrt_dk"), (32, dk_exponent.policy_of(2.0)))]
    assert exponent_plots.plot_loss_vs_c(apart) is None
    assert set(exponent_plots.figures(apart)) == {"c_star_vs_dk.png"}
