"""The c* predictor (`analysis/scale_predictor.py`, issue 53 item 5): its rank correlation
against SciPy's, its rule on hand-made cases, the post-scale std at a located c* against a
hand interpolation, and the command: one line and exit 2 on bad input, and the published
prediction regenerated from the two studies' stores."""

import math
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import REPO, require

from scale_ablation import predict_scale
from scale_ablation.analysis import located
from scale_ablation.analysis import scale_predictor as sp

RESULTS = REPO / "experiments" / "results"


@pytest.mark.parametrize("x,y", [
    ([1, 2, 3, 4], [2, 1, 4, 3]),
    ([0.4, 0.6, 0.4, 0.3, 0.2], [5, 5, 3, 1, 2]),  # ties on both sides
    ([3, 2, 1], [1, 2, 3]),
])
def test_spearman_against_scipy(x, y):
    stats = require("scipy.stats")
    assert sp.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def _optimum(star: float, ci: tuple[float, float]) -> located.Located:
    return located.Located(math.log(star), (math.log(ci[0]), math.log(ci[1])), True, None,
                           False, (star, 1e-3), (0.1, 1.0, 10.0), 3, 6, np.array([]))


def test_an_exact_target_predicts_every_c_star():
    stars = {8: 0.5, 16: 0.4, 32: 0.3, 64: 0.2}
    sigma1 = {d: 3.0 / c for d, c in stars.items()}  # c*·σ₁ = 3 at every d_k
    found = sp.compare(sigma1, {d: _optimum(c, (c / 2, c * 2)) for d, c in stars.items()},
                       "fan_in")
    assert found.target == pytest.approx(3.0) and found.target_spread == pytest.approx(1.0)
    for row in found.rows:
        assert row.predicted == pytest.approx(stars[row.d_k])
    assert found.holds and found.rank_correlation == pytest.approx(1.0)
    assert found.slopes[0] == pytest.approx(found.slopes[1])


def test_one_prediction_outside_its_interval_fails():
    stars = {8: 0.5, 16: 0.4, 32: 0.3, 64: 0.2}
    sigma1 = {8: 6.0, 16: 7.5, 32: 10.0, 64: 60.0}  # d_k 64 implies 12, the others 3
    optima = {d: _optimum(c, (c / 1.5, c * 1.5)) for d, c in stars.items()}
    found = sp.compare(sigma1, optima, "fan_in")
    # Leave one out: d_k 64's target is the others' median, 3, so it predicts 3 / 60 = 0.05.
    assert {r.d_k: r.inside for r in found.rows} == {8: True, 16: True, 32: True, 64: False}
    assert next(r for r in found.rows if r.d_k == 64).predicted == pytest.approx(0.05)
    assert not found.holds


def test_std_at_the_optimum_interpolates_in_log_c():
    rows = [{"policy": policy, "d_k": 8, "lr": 1e-3, "seed": seed, "status": "completed",
             "final_val_bpb": bpb, "final_logit_std": std}
            for policy, bpb, std in (("c_inv_sqrt_dk:0.5", 3.0, 2.0), ("inv_sqrt_dk", 2.9, 4.0),
                                     ("c_inv_sqrt_dk:2", 3.1, 16.0))
            for seed in (0, 1)]
    found = _optimum(math.sqrt(2), (1.0, 2.0))
    found = located.Located(found.log_star, found.log_ci, True, None, False, (1.0, 1e-3),
                            (0.5, 1.0, 2.0), 2, 2, np.log([0.25, 1.0, 1.5, 4.0]))
    std, (low, high) = sp.std_at_optimum(rows, "fan_in", found, 8)
    assert std == pytest.approx(8.0)  # halfway in log c between 4 and 16, in log std
    # Draws past the grid's ends are held at them: the stds there bound the interval. c = 1.5:
    # 4·4^(ln 1.5 / ln 2) = 4·1.5² = 9.
    stds = [2.0, 4.0, 9.0, 16.0]
    assert (low, high) == pytest.approx(tuple(np.quantile(stds, [0.025, 0.975])))


def _command(*args):
    return subprocess.run([sys.executable, "-m", "scale_ablation.predict_scale", *args],
                          capture_output=True, text=True, cwd=REPO)


@pytest.mark.parametrize("args,text", [
    ([], "usage"),
    ([str(RESULTS / "scale_predictor_cpu")], "--measured"),
    (["/nonexistent", "--measured=/nonexistent"], "no such directory"),
    (["a", "b", "--measured=x"], "unexpected arguments"),
])
def test_bad_invocations_are_one_line(args, text):
    done = _command(*args)
    assert done.returncode == 2 and text in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_published_prediction_regenerates(monkeypatch):
    monkeypatch.chdir(REPO)  # the paths the committed file names
    published = RESULTS / "scale_predictor_cpu" / "prediction.md"
    text = predict_scale.write("experiments/results/scale_predictor_cpu",
                               "experiments/results/dk_exponent_cpu")
    assert text == pathlib.Path(published).read_text()


def test_an_elasticity_predicts_a_power_law_of_c():
    """σ(c) = σ₁·c^e with e = 1/2: the two-run predictor's c* = (T/σ₁)^(1/e) is exact."""
    stars = {8: 0.5, 16: 0.4, 32: 0.3}
    sigma1 = {d: 4.0 / math.sqrt(c) for d, c in stars.items()}
    found = sp.compare(sigma1, {d: _optimum(c, (c / 2, c * 2)) for d, c in stars.items()},
                       "gpt2", elasticity={d: 0.5 for d in stars})
    assert [r.predicted for r in found.rows] == pytest.approx(list(stars.values()))
    assert found.target == pytest.approx(4.0) and found.holds


def test_spearman_is_nan_where_scipys_is():
    stats = require("scipy.stats")
    for x, y in (([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]), ([1, 2, 3], [5, 5, 5])):  # a constant side
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy warns of the constant input
            assert math.isnan(stats.spearmanr(x, y).statistic)
        assert math.isnan(sp.spearman(x, y))
    assert math.isnan(sp.spearman([1.0], [2.0]))  # one point has no rank correlation


def test_predict_is_the_in_sample_prediction_at_the_target():
    stars = {8: 0.5, 16: 0.4, 32: 0.25}
    sigma1 = {8: 6.0, 16: 7.0, 32: 13.0}
    found = sp.compare(sigma1, {d: _optimum(c, (c / 2, c * 2)) for d, c in stars.items()}, "x")
    assert sp.predict(sigma1, found.target) == pytest.approx(
        {r.d_k: r.predicted_in_sample for r in found.rows})
    assert sp.predict({8: 4.0}, 2.0) == {8: 0.5}  # c* = T / σ₁


def test_no_std_at_the_optimum_without_a_curve_or_a_value_at_every_c():
    rows = [{"policy": policy, "d_k": 8, "lr": 1e-3, "seed": seed, "status": "completed",
             "final_val_bpb": bpb, "final_logit_std": std}
            for policy, bpb, std in (("c_inv_sqrt_dk:0.5", 3.0, 2.0), ("inv_sqrt_dk", 2.9, 4.0))
            for seed in (0, 1)]
    found = _optimum(0.7, (0.5, 1.0))
    assert sp.std_at_optimum(rows, "fan_in", found, 16) is None  # no runs at d_k 16
    for r in rows[:2]:  # c = 0.5 never logged its std
        del r["final_logit_std"]
    assert sp.std_at_optimum(rows, "fan_in", found, 8) is None
