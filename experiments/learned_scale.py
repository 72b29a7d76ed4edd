r"""Does a learned scale converge to a value ∝ 1/√d_k, as the article's §5.3 claims, where the
scale is identifiable?

  python -m scale_ablation.sweep --config=experiments/learned_scale.py:cpu --workdir=runs/learned_scale_cpu
  python -m scale_ablation.sweep --config=experiments/learned_scale.py:quick --workdir=runs/learned_quick

Why on normalised q and k. The first study (`experiments/results/learned_scale_cpu`) learned one
scale per layer on raw q·k: its final value fell with the LR (0.24 to 0.014 at d_k 16 from LR
1e-3 to 3e-2) because the logit is s·|q||k|cos, and W_Q, W_K can carry any part of s; the scale
was not identifiable apart from the q/k weight norms. Here q and k are first divided by their
RMS over the head (`qk_rmsnorm_nogain`: no gain either, so nothing else can rescale them), so
that |q̂| = |k̂| = √d_k and the logit is s·q̂·k̂ with s the only magnitude left
(`qk_rmsnorm_nogain+learned`: `model/compose.py` gives the composition B's scale;
tests/test_learned_scale.py checks the logits against s·⟨q̂, k̂⟩ in NumPy). If the model wants
logits of a given spread over keys whose directions are spread like random ones, s ∝ 1/√d_k
(q̂·k̂ has std √d_k); if it wants a given largest logit from aligned q̂, k̂ (q̂·k̂ up to d_k), s ∝
1/d_k. The fit tells them apart.

Design (`cpu`). The base CPU model at fixed width (d_model 128, 2 layers, 4 heads of value width
32, 600 steps of 16 × 128 bytes) with d_k the q/k width (`model.qk_dim`) 8, 32 or 128, ×4 apart
(ln 16 = 2.8 of log d_k for the slope). Three arms: the scale learned from 1/√d_k
(`qk_rmsnorm_nogain+learned`) and from 1 (`...+learned:1.0`; constant in d_k at the start, so a
slope of −1/2 at the end is the optimiser's doing, not the start's), and fixed 1/√d_k on the same
normalised q, k (`qk_rmsnorm_nogain`), the baseline of "costs nothing". LRs {3.16e-3, 1e-2,
3.16e-2}, ×√10 around 1e-2: the first study's learned-scale bests were 3e-3 (d_k 128) and 1e-2
(d_k 16) and lr_sensitivity's QK-LayerNorm best 1.78e-2 (normalised q/k take larger steps);
`--refine` adds an LR where a best sits on an edge. 3 seeds. 3 × 3 × 3 × 3 = 81 runs.
Claims: per start, the slope of log s (each run's final value, mean over the 2 layers) on log
d_k at each d_k's best LR, with a 95% interval (`ScaleExponent`: the regression's t interval
over the runs ∪ a bootstrap over seeds), supported when it lies within −1/2 ± 1/4 and excludes −1
and 0, the rule of the d_k exponent (`analysis/exponent.py`); the two starts ending at the same
s (TOST on log10 s, ±0.1, a factor 1.26); the s within a factor 2 of 1/√d_k (the article's
"≈"); learning it costing nothing against fixed 1/√d_k (TOST, ±0.05 bits per byte,
stabilisers.py's margin).
Room to move: s is stored as log s, which Adam moves by at most about lr · scale_lr_multiplier ·
Σ_t schedule(t) over a run (Σ schedule = 327 for 600 steps with 50 of warmup and cosine to 0.1,
`optim.lr_multiplier`); from 1 to 1/√128 needs 2.43. Multiplier 5: 3.16e-3 · 5 · 327 = 5.2 at the
lowest LR (1.0 at multiplier 1), and at the highest a step of at most 0.16 in log s at the peak
(tests/test_learned_scale.py checks the room from the configs).
Time: the base cpu model trains ~11.8 run-steps/s on 2 idle cores (lr_sensitivity:cpu); `--plan`
gives 0.89x (d_k 8), 1.00x and 1.43x (d_k 128) of its FLOPs a run; 81 × 600 × 1.11 / 11.8 ≈ 76
min, plus a 128 KiB test split (~22 run-steps each) and nine compilations (a program per arm and
d_k): ~82 min (`--plan`, without a cpu throughput table, says 1.7 device-hours at 40% of the
matmul rate it measured).

Variants:
- `cpu` (2 cores): as above.
- default (one accelerator): the gpu model (d_model 512, 8 layers, 8 heads of value width 64),
  d_k = qk_dim 16, 64, 256; the same three arms, 5 LRs ×2 around 1e-2, 3 seeds, 5000 steps,
  multiplier 2 (the lowest LR, 2.5e-3, then allows 2.5e-3 · 2 · 2750 = 13.8 of log-scale
  movement, ln √256 = 2.8 needed).
- `quick` (smoke): the quick model, d_k 8, 16, 32, the two learned starts × 2 LRs, one seed, 60
  steps: 12 runs in 6 programs, 3.5 min on 2 cores loaded by other work, most of it compiling.

Budget (default): 3.20 device-hours on one H200, 135 runs, 4.06e18 train FLOPs
(`python -m scale_ablation.sweep --config=experiments/learned_scale.py --workdir=DIR --plan
--device=H200`; FLOPs at the planner's assumed 40% MFU until a measured throughput table
exists, compilation not counted; tests/test_planner.py holds it to 25%).
"""

import dataclasses
import math

import numpy as np

from experiments import base
from scale_ablation.analysis import claims as claims_lib
from scale_ablation.analysis import comparisons as cmp
from scale_ablation.analysis import exponent, intervals

NORM = "qk_rmsnorm_nogain"  # q, k divided by their RMS over the head, no gain
FROM_SQRT = f"{NORM}+learned"  # the learned scale, started at 1/√d_k
FROM_ONE = f"{NORM}+learned:1.0"  # started at 1
POLICIES = (NORM, FROM_SQRT, FROM_ONE)
QK_DIMS = {"quick": (8, 16, 32), "cpu": (8, 32, 128), None: (16, 64, 256)}
LRS = {"quick": (1e-2, 3e-2), "cpu": base.lr_grid_around(1e-2, points=3, factor=10**0.5),
       None: base.lr_grid_around(1e-2)}
SEEDS = {"quick": (0,), "cpu": (0, 1, 2), None: base.ACCELERATOR_SEEDS}
# Points added after a pass, where a best sat on its grid's edge: (policy, qk_dim) -> extra LRs.
WIDER: dict[tuple[str, int], tuple[float, ...]] = {}
SCALE_LR_MULTIPLIER = {"quick": 20.0, "cpu": 5.0, None: 2.0}
BAND = 2.0  # "≈ 1/√d_k": the final scale within [1/(2√d_k), 2/√d_k]
SAME_START_LOG10 = 0.1  # the two starts' final s within a factor 10^0.1 = 1.26
MARGIN_BPB = 0.05  # "costs nothing" (stabilisers.py: twice 1/√d_k's seed std at its best LR)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("learned_scale",)
    config.train.scale_lr_multiplier = SCALE_LR_MULTIPLIER[arg]
    # The trajectory is the result: a point every 20-25 steps (diagnostics cost one forward).
    config.train.diag_every = {"quick": 20, "cpu": 25}.get(arg, 100)
    # q/k apart from v (`model.qk_dim`) reach only the reference attention path.
    config.model.attention_impl = "reference"
    if arg == "cpu":
        config.data.test_bytes = 128 * 1024  # the docstring's cost of scoring
    return config


def sweep(arg: str | None = None) -> list[dict]:
    arms = POLICIES[1:] if arg == "quick" else POLICIES  # quick: the learned starts only
    return [{"policy": policy, "model.qk_dim": qk_dim, "train.lr": lr, "train.seed": seed}
            for policy in arms for qk_dim in QK_DIMS[arg]
            for lr in base.lr_grid_for((policy, qk_dim), LRS[arg], WIDER)
            for seed in SEEDS[arg]]


# --------------------------------------------------------------------------- the slope's rule


def scale_at_best_lr(rows: list[dict], policy: str,
                     metric: str = "final_learned_scale") -> tuple[dict, dict]:
    """({d_k: [log value per run at the best LR]}, {d_k: why it is no location}) over the
    policy's runs; the LR chosen on the sweep's validation metric (`comparisons.best_lrs`)."""
    key, higher = cmp.primary_metric(rows)
    located, unsettled = {}, {}
    for best in cmp.best_lrs([r for r in rows if r["policy"] == policy], key, higher):
        if best.lr is None:
            unsettled[best.d_k] = "no LR had every run complete"
        elif best.at_edge:  # a wider grid can move the value either way
            unsettled[best.d_k] = f"best LR {best.lr:g} on its grid's edge"
        values = [v for r in best.runs if (v := cmp.finished_value(r, metric)) and v > 0]
        if best.lr is not None and values:
            located[best.d_k] = [math.log(v) for v in values]
    return located, unsettled


def slope_intervals(points: dict[int, list[float]], n_boot: int = 1000, seed: int = 0,
                    ) -> tuple[float, tuple[float, float] | None, tuple[float, float] | None]:
    """(OLS slope of y on log d_k over every run, its t interval from the d_k means on
    (number of d_k) − 2 degrees of freedom, a percentile bootstrap over seeds: each d_k's runs
    resampled with replacement). The t interval's degrees of freedom follow the independent
    d_k means, not the runs: seeds at one d_k share its deviation from the line, so N − 2 over
    the runs would count a bend as noise averaged away (issue 54)."""
    d_ks = sorted(points)
    x = np.concatenate([np.full(len(points[d]), math.log(d)) for d in d_ks])
    y = np.concatenate([np.asarray(points[d], float) for d in d_ks])
    slope, _, _ = exponent.ols(x, y)
    means = np.array([np.mean(points[d]) for d in d_ks])
    _, _, se = exponent.ols(np.log(np.array(d_ks, float)), means)
    t_ci = None
    if se is not None:
        half = intervals.t_quantile(len(d_ks) - 2, 0.95) * se
        t_ci = (slope - half, slope + half)
    if min(len(v) for v in points.values()) < 2:
        return slope, t_ci, None
    rng = np.random.default_rng(seed)
    boots = np.empty(n_boot)
    for b in range(n_boot):
        draw = [np.asarray(points[d])[rng.integers(0, len(points[d]), len(points[d]))]
                for d in d_ks]
        boots[b] = np.polyfit(x, np.concatenate(draw), 1)[0]
    low, high = np.percentile(boots, [2.5, 97.5])
    return slope, t_ci, (float(low), float(high))


@dataclasses.dataclass(frozen=True)
class ScaleExponent:
    """Claim: the learned scale of `policy` ends ∝ d_k^expected. Supported when the 95% interval
    of the slope of log s on log d_k (the union of the regression's t interval over the d_k means
    and a bootstrap over seeds) excludes −1 and 0 and lies within expected ± margin; contradicted
    when it lies wholly outside; otherwise, or with a d_k whose best LR is on its grid's edge,
    or fewer than three d_k, inconclusive. A decision by interval at 95%, not part of the Holm
    family (as `exponent_claims.Exponent`)."""

    policy: str
    expected: float = -0.5
    margin: float = 0.25
    metric: str = "final_learned_scale"

    @property
    def policies(self) -> tuple[str, ...]:
        return (self.policy,)

    def describe(self) -> str:
        return (f"supported if the 95% interval of the slope of log {self.metric} on log d_k "
                f"({self.policy}, each d_k at its best LR; OLS over the runs, t ∪ bootstrap over "
                f"seeds) excludes −1 and 0 and lies within {self.expected:g} ± {self.margin:g}")

    def judge(self, rows: list[dict]) -> claims_lib.Verdict:
        located, unsettled = scale_at_best_lr(rows, self.policy, self.metric)
        numbers = [f"{self.policy} d_k={d}: s = {math.exp(np.mean(v)):.4g} (geometric mean, "
                   f"n={len(v)}), s·√d_k = {math.exp(np.mean(v)) * math.sqrt(d):.3g}"
                   + (f" — not a location: {unsettled[d]}" if d in unsettled else "")
                   for d, v in sorted(located.items())]
        if len(located) < 3:
            return claims_lib.Verdict("inconclusive", "fewer than three d_k with a final "
                                      "scale", tuple(numbers))
        slope, t_ci, boot_ci = slope_intervals(located)
        text = lambda ci: "n/a" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"  # noqa: E731
        numbers.append(f"{self.policy}: slope {slope:+.3f} over d_k {sorted(located)}; 95% t "
                       f"{text(t_ci)}, bootstrap over seeds {text(boot_ci)}")
        if t_ci is None or boot_ci is None or unsettled:
            return claims_lib.Verdict("inconclusive", "no interval, or a d_k's best LR is on "
                                      "its grid's edge", tuple(numbers))
        ci = (min(t_ci[0], boot_ci[0]), max(t_ci[1], boot_ci[1]))
        low, high = self.expected - self.margin, self.expected + self.margin
        band = f"{self.expected:g} ± {self.margin:g}"
        if ci[1] < low or ci[0] > high:
            return claims_lib.Verdict("contradicted", f"the slope's interval {text(ci)} lies "
                                      f"outside {band}", tuple(numbers))
        if low <= ci[0] and ci[1] <= high and not (ci[0] <= -1 <= ci[1] or ci[0] <= 0 <= ci[1]):
            return claims_lib.Verdict("supported", f"the slope's interval {text(ci)} lies "
                                      f"within {band}", tuple(numbers))
        return claims_lib.Verdict("inconclusive", f"the slope's interval {text(ci)} crosses "
                                  f"the edge of {band} or holds −1 or 0", tuple(numbers))


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    text = "A learned scale on normalised q and k ends ∝ 1/√d_k, started at {}"
    costs_nothing = [] if arg == "quick" else [claims_lib.Claim(
        "Learning the scale costs nothing: it ends as well as fixed 1/√d_k on the same "
        "normalised q and k, each at its own best learning rate",
        claims_lib.Compare("indistinguishable", policies=(FROM_SQRT, FROM_ONE), reference=NORM,
                           margin=MARGIN_BPB), source="article §5.3")]
    return [
        claims_lib.Claim(text.format("1/√d_k"), ScaleExponent(FROM_SQRT), source="article §5.3"),
        claims_lib.Claim(text.format("1"), ScaleExponent(FROM_ONE), source="article §5.3"),
        claims_lib.Claim(
            "The learned scale ends at the same value from either start (an attractor, not the "
            "starting point)",
            claims_lib.Compare("indistinguishable", policies=(FROM_ONE,), reference=FROM_SQRT,
                               metric="final_learned_scale", log10=True,
                               margin=SAME_START_LOG10), source="article §5.3"),
        claims_lib.Claim(
            "A learned scale on normalised q and k converges to ≈1/√d_k (within a factor 2), "
            "whether it starts there or at 1",
            claims_lib.Band(BAND, policies=(FROM_SQRT, FROM_ONE)), source="article §5.3"),
        *costs_nothing,
    ]
