r"""The exponent where every d_k is small beside the width, at two budgets run as runs of their
own (issue 53, item 4): experiments/dk_exponent.py's c·d_k^(-1/2) family, at d_model 256 with
d_k 8…64 (≤ d_model/4, so no head's q·k form is full rank by its width alone), and each run
trained for 200 or for 1,600 steps with its own cosine schedule (not a snapshot of one).

  python -m scale_ablation.sweep --config=experiments/dk_exponent_regime.py:cpu \
      --workdir=runs/dk_exponent_regime_cpu --plan      # its size first: see below
  python -m scale_ablation.sweep --config=experiments/dk_exponent_regime.py:cpu_short \
      --workdir=runs/dk_exponent_regime_cpu --refine --refine_rounds=2   # published
  python -m scale_ablation.sweep --config=experiments/dk_exponent_regime.py:cpu \
      --workdir=runs/dk_exponent_regime_cpu --refine --refine_rounds=3 --max_members=18
  python -m scale_ablation.report runs/dk_exponent_regime_cpu

Two rounds of `--refine` for the 200-step runs: on the shared ×2 LR grid {1e-3, 2e-3, 4e-3}
they put fan_in's best LR on the top edge and gpt2's on the bottom one at nearly every d_k and C;
round 1 stepped each edge out by ×2 and round 2 once more where gpt2's C = 16 still sat on one
(experiments/results/dk_exponent_regime_cpu/README.md). The 1,600-step runs' LRs are centred per
init and C on those bests (`LONG_LR_CENTRES`), and get one round (the third: rounds are counted
over the study).

Claims, per init and per budget: α within −1/2 ± 1/4 and within −1 ± 1/4 over all d_k, one
power law, 1/√d_k within 0.02 bits per byte of the best C at every d_k; and per init, α the same
at the two budgets (`exponent_claims.ExponentShift` with `budgets`). Each budget locates its own LR and
C* (analysis/located.py: both re-chosen in every posterior draw).

Variants:
- `cpu`: d_model 256, 2 layers, 4 heads of value width 64, d_k = qk_dim 8…64 (4), C ×2 over
  six values per init (fan_in 1/16…2, gpt2 1/2…16: dk_exponent:cpu's c* at d_model 128 were
  0.14–0.64 and 1.6–6.7; gpt2's q, k entries grow as √d_model, so its C* should fall by ~√2),
  LRs {1e-3, 2e-3, 4e-3} at 200 steps (mup_transfer:cpu's SP best LR fell ×5 from width 64 to
  256) and ×2 around `LONG_LR_CENTRES` at 1,600, 3 seeds, both inits, budgets 200 and 1,600
  steps of 16 × 64 bytes: 864 runs, 7.3e15 train FLOPs (the 1,600-step 432: 16.6 h by `--plan`
  with the 12-07 arrangement table, 2026-12-07).
  `--plan` on the 2-core VM: 67 CPU-hours at its old assumed rate (40% of a measured 77 GFLOP/s
  matmul; the 1,600-step runs are 89% of it), 20.5 h at the rates of the idle arrangement
  table (benchmarks/results/arrangements_amd-epyc_2core_2026-12-06.json): several sessions.
  `cpu_short` is the same grid's 200-step half (432 runs, ~7.4 CPU-hours at the old rate, 2.4 h
  by the table; its grid ran 16 min per ensemble of 54 runs in one process with the machine
  to itself, by its stash commits: ~2.1 h for the 432, 2026-12-07), with the same run names:
  run it first into the same workdir, publish it, and the `cpu` sweep there later trains only
  the 1,600-step runs.
- default (one accelerator): d_model 1024, 4 layers, 8 heads of value width 128, d_k 16…256,
  C ×2 over seven values per init (fan_in 1/32…2, gpt2 1/8…8), 3 LRs ×2 around 1e-3, 3 seeds,
  budgets 250 and 2,000 steps of 64 × 512 bytes of WikiText-103: 1,260 runs. `--plan
  --device=H200`: 1.42e19 train FLOPs, 11.4 device-hours at the planner's assumed 40% MFU.
- `quick` (tests): d_model 64, 4 heads, d_k 4, 8, 16, C {1/2, 1, 2}, one LR, 2 seeds, one
  init, budgets 10 and 20 steps.
"""

from experiments import base, dk_exponent
from scale_ablation.analysis import claims as claims_lib
from scale_ablation.analysis import exponent_claims

INITS = dk_exponent.INITS
# model: (d_model, heads, layers); data: (batch, seq_len); q/k dims; C per init; LRs; seeds;
# inits; budgets (train.steps of runs of their own).
SIZES = {
    "quick": ((64, 4, 1), (4, 32), (4, 8, 16), {"fan_in": (0.5, 1.0, 2.0)}, (4e-3,), (0, 1),
              ("fan_in",), (10, 20)),
    "cpu": ((256, 4, 2), (16, 64), (8, 16, 32, 64),
            {"fan_in": tuple(2.0**k for k in range(-4, 2)),
             "gpt2": tuple(2.0**k for k in range(-1, 5))},
            (1e-3, 2e-3, 4e-3), (0, 1, 2), INITS, (200, 1600)),
    # One accelerator: d_model 1024, 8 heads of value width 128, d_k 16…256 (≤ d_model/4).
    None: ((1024, 8, 4), (64, 512), (16, 32, 64, 128, 256),
           {"fan_in": tuple(2.0**k for k in range(-5, 2)),
            "gpt2": tuple(2.0**k for k in range(-3, 4))},
           base.lr_grid_around(1e-3, points=3), base.ACCELERATOR_SEEDS, INITS, (250, 2000)),
}
SIZES["cpu_short"] = (*SIZES["cpu"][:-1], (200,))
# The 1,600-step runs' LRs, per init and C: ×2 either side of the 200-step runs' best LR (the
# 3-seed mean of final_val_bpb at each d_k; the lower median over d_k) in
# experiments/results/dk_exponent_regime_cpu, which tests/test_exponent_regime.py recounts from
# its runs.parquet. Why not the shared {1e-3, 2e-3, 4e-3}: it left nearly every 200-step best on
# an edge, and a refinement costs 8× as much at 1,600 steps.
LONG_LR_CENTRES = {
    "fan_in": {0.0625: 4e-3, 0.125: 4e-3, 0.25: 4e-3, 0.5: 2e-3, 1.0: 0.00141421,
               2.0: 0.00141421},
    "gpt2": {0.5: 0.00141421, 1.0: 0.00141421, 2.0: 1e-3, 4.0: 1e-3, 8.0: 1e-3, 16.0: 5e-4}}
LONG_STEPS = max(SIZES["cpu"][-1])


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu", "cpu_short"))
    (d_model, heads, layers), (batch, seq_len), *_, budgets = SIZES[arg]
    config = dk_exponent.get_config({"quick": "quick", None: None}.get(arg, "cpu"))
    m, t = config.model, config.train
    m.d_model, m.num_heads, m.num_layers, m.head_dim = d_model, heads, layers, d_model // heads
    config.data.seq_len, t.batch_size = seq_len, batch
    config.wandb.tags = ("dk_exponent_regime",)
    _set_budget(config, max(budgets))
    return config


def _set_budget(config, steps: int) -> None:
    """A run's schedule follows its own budget: warmup 1/20, two evaluations (halfway, end)."""
    t = config.train
    t.steps, t.warmup_steps = steps, max(steps // 20, 1)
    t.log_every, t.eval_every, t.diag_every = max(steps // 10, 1), steps // 2, steps // 2
    config.checkpoint.every = steps // 2


def _budget_fields(steps: int) -> dict:
    return {"train.steps": steps, "train.warmup_steps": max(steps // 20, 1),
            "train.log_every": max(steps // 10, 1), "train.eval_every": steps // 2,
            "train.diag_every": steps // 2, "checkpoint.every": steps // 2}


def sweep(arg: str | None = None) -> list[dict]:
    _, _, qk_dims, cs, _, seeds, inits, budgets = SIZES[arg]
    return [{"policy": dk_exponent.policy_of(c), "model.qk_dim": qk_dim, "model.init": init,
             **_budget_fields(steps), "train.lr": lr, "train.seed": seed}
            for steps in budgets for init in inits for qk_dim in qk_dims for c in cs[init]
            for lr in lrs_of(arg, init, c, steps) for seed in seeds]


def lrs_of(arg: str | None, init: str, c: float, steps: int) -> tuple[float, ...]:
    """The LR grid of (init, C) in runs of `steps` steps: the variant's, but centred per C at 1,600."""
    if arg == "cpu" and steps == LONG_STEPS:
        centre = LONG_LR_CENTRES[init][c]
        return tuple(float(f"{lr:.6g}") for lr in (centre / 2, centre, centre * 2))
    return SIZES[arg][4]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    *_, inits, budgets = SIZES[arg]
    out = []
    for init in inits:
        for steps in budgets:
            where = f"{init} init, runs of {steps} steps"
            out += [
                claims_lib.Claim(f"The optimal scale is ∝ d_k^(−1/2) ({where})",
                                 exponent_claims.Exponent(init, steps=steps), source="article §2.3"),
                claims_lib.Claim(f"The optimal scale is ∝ d_k^(−1), μP's 1/d_k ({where})",
                                 exponent_claims.Exponent(init, expected=-1.0, steps=steps),
                                 source="Yang et al. 2022"),
                claims_lib.Claim(f"One power law describes the optimal scale ({where})",
                                 exponent_claims.OnePowerLaw(init, steps=steps), source="issue 53"),
                claims_lib.Claim(f"1/√d_k is within 0.02 bits per byte of the best scale at "
                                 f"every d_k ({where})", exponent_claims.ScaleCost(init, steps=steps),
                                 source="article §2.3")]
        if len(budgets) < 2:
            continue
        out.append(claims_lib.Claim(
            f"The optimal scale's exponent is the same after {budgets[0]} and {budgets[1]} "
            f"steps, each a run of its own ({init} init)",
            exponent_claims.ExponentShift(init, budgets=budgets), source="issue 53"))
    return out
