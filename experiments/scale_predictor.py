r"""The mechanism behind c* and a predictor of it (issue 53, item 5): experiments/dk_exponent.py's
model at c = 1 (1/√d_k) only, one LR and one seed per (init, d_k), with the attention logits'
sources logged over training (`model.logit_sources`: the std of the pre-scale q·k, of the
initial weights' part q₀·k₀, of the updates' part, and of the post-scale logits).

  python -m scale_ablation.sweep --config=experiments/scale_predictor.py:cpu \
      --workdir=runs/scale_predictor_cpu
  python -m scale_ablation.predict_scale runs/scale_predictor_cpu \
      --measured=experiments/results/dk_exponent_cpu

Hypothesis: c* is the c that puts the post-scale logit std at the end of training on a target
independent of d_k. From one run at c = 1 per d_k, whose final post-scale std is σ₁(d_k), the
post-scale std at c is taken as c·σ₁(d_k) (the pre-scale logits as they were at c = 1), so c* =
T / σ₁(d_k); `analysis/scale_predictor.py` states the target T, the rule and the verdict against
dk_exponent's located c* and their intervals.

Design: the dk_exponent variant's config (model, data, steps, schedule, evaluation) with the
policy inv_sqrt_dk, one seed (0) and each init's one LR, the LR at which dk_exponent:cpu
located its best c at most d_k (fan_in 5e-3, gpt2 2.5e-3), so that each run is the same run
as dk_exponent's at (c = 1, that LR, seed 0), now with the sources logged: its final loss is
that run's. Diagnostics every tenth of the run (the sources over training), not only halfway.

Variants and budget:
- `cpu`: dk_exponent:cpu's model (d_model 128, 2 layers, 4 heads), d_k 8…256 (6), both inits:
  12 runs of 400 steps × 16 × 64 bytes. `--plan`: 1.63e13 train FLOPs, 0.33 CPU-hours at its
  assumed rate; it took 26 min wall on the shared 2-core VM at load 7–10
  (experiments/results/scale_predictor_cpu).
- default (one accelerator): dk_exponent's default model, d_k 16…1024 (7), both inits, LR 3e-3
  (its grid's centre): 14 runs of 2,000 steps, the sources of the accelerator study's c = 1.
- `quick` (tests): dk_exponent:quick at c = 1, d_k 8 and 32, one init.

Published verdict (experiments/results/scale_predictor_cpu): the one-run predictor fails under
fan_in and passes gpt2 only through wide intervals; so no prediction is printed for a planned grid.
"""

from experiments import dk_exponent

# Each init's one LR (dk_exponent:cpu located its best c at these at most d_k); the default
# variant's grid centre; quick's first LR.
LRS = {"quick": {"fan_in": 4e-3},
       "cpu": {"fan_in": 5e-3, "gpt2": 2.5e-3},
       None: {"fan_in": 3e-3, "gpt2": 3e-3}}


def get_config(arg: str | None = None):
    config = dk_exponent.get_config(arg)
    config.wandb.tags = ("scale_predictor",)
    config.policy = dk_exponent.policy_of(1.0)
    # The sources over training: ten diagnostics (dk_exponent's are halfway and at the end).
    config.train.diag_every = max(config.train.steps // 10, 1)
    return config


def sweep(arg: str | None = None) -> list[dict]:
    _, _, qk_dims, _, _, _, inits = dk_exponent.SIZES[arg]
    return [{"model.qk_dim": qk_dim, "model.init": init, "train.lr": LRS[arg][init],
             "train.seed": 0}
            for init in inits for qk_dim in qk_dims]
