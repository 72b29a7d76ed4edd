r"""LR sensitivity and attention-logit growth (Wortsman et al. 2023, "Small-scale proxies").

  python -m scale_ablation.sweep --config=experiments/lr_sensitivity.py:cpu \
      --workdir=runs/lr_sensitivity_cpu

A log-spaced learning-rate grid × seeds × policies × d_k: each policy is compared at its own best
learning rate, and final loss against LR is the curve Wortsman et al. plot. The report gives, per
policy and d_k, the best LR (flagged when it sits on the grid's edge), the loss there with a 95%
CI over seeds, the LR-sensitivity metric E_lr[min(loss(lr), loss_init) − min_lr loss(lr)], and
max |attention logit| per layer over training and against LR, the growth that QK-LayerNorm is
meant to prevent.

Variants: `cpu` (the study for 2 cores: the base CPU model, 4 heads × d_k 32 = d_model 128,
600 steps; 4 policies × 7 LRs × 3 seeds = 84 runs, about 1.5 hours: README, Results), default
(one accelerator: width as the axis, d_model 256, 512, 1024 with heads of d_k 64, the same 7
LRs, which hold every cpu best inside, × 3 seeds, 3000 steps) and `quick` (smoke-level, a few
minutes on 2 cores).

Budget (default): 4.90 device-hours on one H200, 252 runs, 6.94e18 train FLOPs
(`python -m scale_ablation.sweep --config=experiments/lr_sensitivity.py --workdir=DIR --plan
--device=H200`; FLOPs at the planner's assumed 40% MFU until a measured throughput table
exists, compilation not counted; tests/test_planner.py holds it to 25%).
"""

import numpy as np

from experiments import base
from scale_ablation.analysis import claims as claims_lib

POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "qk_layernorm")


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg)
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("lr_sensitivity",)
    # Logit growth needs a time series.
    config.train.diag_every = {"quick": 20, "cpu": 25}.get(arg, 100)
    if arg is None:
        config.train.steps = ACCELERATOR_STEPS
    if arg == "quick":
        config.train.steps = 100
        config.train.log_every = 5  # spikes are judged on the logged training loss
        config.train.eval_every = 20
        config.checkpoint.every = 100
    return config


def lr_grid(arg: str | None = None) -> list[float]:
    """Log-spaced, 3e-4 .. 1: wide enough that every policy's best learning rate is interior
    (the cpu study's bests: 1e-3 to 1.78e-2)."""
    return [float(f"{lr:.3g}") for lr in np.logspace(-3.5, 0.0, 7)]


ACCELERATOR_WIDTHS = (256, 512, 1024)  # d_model; heads = d_model / 64, d_k 64
ACCELERATOR_STEPS = 3000


def accelerator_sweep() -> list[dict]:
    """Width as the axis: Wortsman et al. find the logit growth QK-LayerNorm cures at larger
    models, so each policy's loss-against-LR curve is measured at three widths, d_k 64."""
    return [{"policy": policy, "model.d_model": width, "model.num_heads": width // 64,
             "model.head_dim": 64, "train.lr": lr, "train.seed": seed}
            for policy in POLICIES for width in ACCELERATOR_WIDTHS for lr in lr_grid()
            for seed in base.ACCELERATOR_SEEDS]


def sweep(arg: str | None = None) -> list[dict]:
    if arg is None:
        return accelerator_sweep()
    head_dims = {"quick": (64,), "cpu": (32,)}.get(arg, (64, 256))
    seeds = (0, 1, 2)
    return [
        {"policy": policy, "model.head_dim": head_dim, "train.lr": lr, "train.seed": seed}
        for policy in POLICIES
        for head_dim in head_dims
        for lr in lr_grid(arg)
        for seed in seeds
    ]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    return [
        claims_lib.Claim(
            "With scale 1 or 1/d_k the Transformer diverged or oscillated; only 1/√d_k trained "
            "smoothly", claims_lib.Unstable(("none", "inv_dk"), expect_unstable=True),
            source="article §1"),
        claims_lib.Claim(
            "1/√d_k trains smoothly", claims_lib.Unstable(("inv_sqrt_dk",), expect_unstable=False),
            source="article §1"),
        claims_lib.Claim(
            "Scale 1 and 1/d_k end worse than 1/√d_k, each policy at its own best learning rate",
            claims_lib.Compare("worse", policies=("none", "inv_dk")), source="article §1"),
        claims_lib.Claim(
            "QK-LayerNorm makes the final loss less sensitive to the learning rate",
            claims_lib.Compare("better", policies=("qk_layernorm",), metric="lr_sensitivity"),
            source="Wortsman et al. 2023"),
        claims_lib.Claim(
            "QK-LayerNorm keeps the attention logits from growing at large learning rates",
            claims_lib.Compare("better", policies=("qk_layernorm",),
                               metric="max_attention_logit", at="each_lr", min_lr=0.05,
                               log10=True),
            source="Wortsman et al. 2023"),
    ]
