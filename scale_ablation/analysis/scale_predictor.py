"""c* of the c·d_k^(-1/2) family predicted from one run at c = 1 per d_k, and the test of the
hypothesis behind it (issue 53, item 5).

Hypothesis: c* is the c that puts the post-scale logit std at the end of training on a target T
independent of d_k. A run at c = 1 gives σ₁(d_k), its final post-scale std (`final_qk_std_scaled`,
`model.logit_sources`: the std over every visible (batch, head, query, key), the mean over
layers). Taking the post-scale std at c as c·σ₁(d_k) (the pre-scale logits as they were at
c = 1), c* = T / σ₁(d_k).

The target. Each d_k with a measured c* implies one, T(d_k) = c*(d_k)·σ₁(d_k); the hypothesis
says they are one number. The prediction at each d_k takes T as the median of the *other*
d_k's implied targets (leave one out), so that no d_k's prediction has seen its own c*; the
in-sample median is given beside it.

The rule: the predictor holds if every predicted c* lies inside the measured c*'s 95% interval
(located.py's, the LR and the best c re-chosen in every draw) and the rank correlation (Spearman)
of predicted and measured c* over d_k is positive; it fails otherwise.

Exploratory, designed after the test above had been run: two runs per d_k, at c = 1 and at a
lower c, give each d_k's elasticity e (the slope of log std on log c between them), and the
post-scale std at c is taken as σ₁·c^e (`elasticities`; `compare`'s `elasticity`): training
makes up for part of a smaller c, so the std falls more slowly than c.

Also here, the hypothesis read off a study that swept c: the post-scale std at the measured c*,
interpolated in log c between the grid's c (each at its best LR, the seeds' mean), with the
interval its c*'s draws give (`std_at_optimum`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import exponent, located
from scale_ablation.model import logit_sources, scale_family
from scale_ablation.records import metrics_rows as rm

SCALED = "final_qk_std_scaled"  # the report rows' final post-scale std (mean over layers)


def row_fields(last_diag: dict) -> dict:
    """The report row's fields from a run's last diagnostics row: final_qk_std (pre-scale q·k),
    final_qk_std_init (q₀·k₀, the initial q/k weights' part), final_qk_std_update (the rest)
    and final_qk_std_scaled (what enters the softmax), each the mean over layers and per layer
    (/layer{i}); none for a run that did not log them, whose row stays as it was."""
    out: dict = {}
    for stat in logit_sources.STATS:
        per_layer = rm.layer_values(last_diag, stat)
        if per_layer:
            out[f"final_{stat}"] = rm.layer_mean(last_diag, stat)
            out.update({f"final_{stat}/layer{i}": v for i, v in sorted(per_layer.items())})
    return out


def at_c(rows: list[dict], init: str, c: float = 1.0, key: str = SCALED, *,
         lr: float | None = None, seed: int | None = None) -> dict[int, float]:
    """d_k -> the mean of `key` over the init's finished runs at c (default 1: 1/√d_k), of one
    LR and one seed when given."""
    found: dict[int, list[float]] = {}
    for r in exponent.init_rows(rows, init):
        value = cmp.finished_value(r, key)
        if (scale_family.multiplier(r["policy"]) == c and value is not None
                and lr in (None, float(r["lr"])) and seed in (None, r["seed"])):
            found.setdefault(int(r["d_k"]), []).append(value)
    return {d_k: float(np.mean(values)) for d_k, values in sorted(found.items())}


def elasticities(rows: list[dict], init: str, low_c: float, key: str, *, lr: float,
                 seed: int) -> dict[int, float]:
    """d_k -> e, the slope of log std on log c between c = `low_c` and c = 1 (one LR, one
    seed): the exploratory two-run predictor's σ(c) = σ₁·c^e (`compare`'s `elasticity`)."""
    low = at_c(rows, init, low_c, key, lr=lr, seed=seed)
    high = at_c(rows, init, 1.0, key, lr=lr, seed=seed)
    return {d: math.log(high[d] / low[d]) / -math.log(low_c) for d in sorted(set(low) & set(high))}


def predict(sigma1: dict[int, float], target: float) -> dict[int, float]:
    """d_k -> predicted c* = target / σ₁(d_k)."""
    return {d_k: target / sigma for d_k, sigma in sigma1.items()}


def implied_targets(sigma1: dict[int, float], stars: dict[int, float],
                    elasticity: dict[int, float] | None = None) -> dict[int, float]:
    """d_k -> T(d_k) = σ₁(d_k)·c*(d_k)^e (e = 1 unless given), over the d_k that have all."""
    e = elasticity or {d_k: 1.0 for d_k in sigma1}
    return {d_k: sigma1[d_k] * stars[d_k] ** e[d_k]
            for d_k in sorted(set(sigma1) & set(stars) & set(e))}


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank); nan below two points."""
    def ranks(values: list[float]) -> np.ndarray:
        values = np.asarray(values, float)
        order = values.argsort()
        out = np.empty(len(values))
        out[order] = np.arange(len(values), dtype=float)
        for value in np.unique(values):  # ties: their mean rank
            out[values == value] = out[values == value].mean()
        return out

    if len(x) < 2:
        return math.nan
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclasses.dataclass(frozen=True)
class Row:
    """One d_k of the comparison."""

    d_k: int
    sigma1: float  # the final post-scale std at c = 1
    implied: float  # c*·σ₁: the target this d_k's measured c* implies
    predicted: float  # c* from the others' median target (leave one out)
    predicted_in_sample: float  # c* from every d_k's median target
    star: float  # the measured c*
    ci: tuple[float, float]  # its 95% interval

    @property
    def inside(self) -> bool:
        return self.ci[0] <= self.predicted <= self.ci[1]


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The predictor against one init's measured c*: its rows, the median target, the rank
    correlation, and the verdict (`holds`)."""

    init: str
    rows: tuple[Row, ...]
    target: float  # the in-sample median of the implied targets

    @property
    def rank_correlation(self) -> float:
        return spearman([r.predicted for r in self.rows], [r.star for r in self.rows])

    @property
    def target_spread(self) -> float:
        """The largest implied target over the smallest: 1 if the hypothesis is exact."""
        implied = [r.implied for r in self.rows]
        return max(implied) / min(implied)

    @property
    def slopes(self) -> tuple[float, float]:
        """The least-squares slopes of log c* on log d_k, (predicted, measured)."""
        log_d = np.log([r.d_k for r in self.rows])
        return tuple(float(np.polyfit(log_d, np.log([getattr(r, name) for r in self.rows]),
                                      1)[0]) for name in ("predicted", "star"))

    @property
    def holds(self) -> bool:
        return (len(self.rows) >= 3 and all(r.inside for r in self.rows)
                and self.rank_correlation > 0)


def compare(sigma1: dict[int, float], optima: dict[int, located.Located], init: str,
            elasticity: dict[int, float] | None = None) -> Comparison:
    """The predictor from `sigma1` (d_k -> σ₁) against the measured `optima` (d_k -> c*). With
    `elasticity` (d_k -> e), the post-scale std at c is σ₁·c^e, not c·σ₁, so c* = (T/σ₁)^(1/e)."""
    stars = {d_k: o.star for d_k, o in optima.items()}
    implied = implied_targets(sigma1, stars, elasticity)
    e = elasticity or {d_k: 1.0 for d_k in implied}
    target = statistics.median(implied.values())
    rows = []
    for d_k, t in implied.items():
        others = statistics.median(v for d, v in implied.items() if d != d_k)
        rows.append(Row(d_k, sigma1[d_k], t, (others / sigma1[d_k]) ** (1 / e[d_k]),
                        (target / sigma1[d_k]) ** (1 / e[d_k]), stars[d_k], optima[d_k].ci))
    return Comparison(init, tuple(rows), target)


def std_at_optimum(rows: list[dict], init: str, found: located.Located, d_k: int,
                   key: str = "final_logit_std") -> tuple[float, tuple[float, float]] | None:
    """The post-scale std `key` at the measured c* of one d_k of a study that swept c: the
    seeds' mean at each c's best LR, interpolated in log c (linear in log std), at c* and at
    the ends of c*'s draws' 95% interval; None when a c of the curve lacks the value."""
    curve = exponent.c_curves(rows, init).get(d_k)
    if curve is None:
        return None
    stds = []
    for c, lr in zip(curve.cs, curve.best_lrs, strict=True):
        values = [r[key] for r in exponent.init_rows(rows, init)
                  if int(r["d_k"]) == d_k and scale_family.multiplier(r["policy"]) == c
                  and float(r["lr"]) == lr and cmp.finished_value(r, key) is not None]
        if not values:
            return None
        stds.append(math.log(float(np.mean(values))))
    log_cs = np.log(curve.cs)

    def at(log_c: np.ndarray) -> np.ndarray:
        return np.exp(np.interp(log_c, log_cs, stds))

    # A draw beyond the grid is held at its edge: the std there bounds it.
    draws = at(np.clip(found.draws[~np.isnan(found.draws)], log_cs[0], log_cs[-1]))
    low, high = np.quantile(draws, [0.025, 0.975]) if draws.size else (math.nan, math.nan)
    return float(at(np.asarray(found.log_star))), (float(low), float(high))
