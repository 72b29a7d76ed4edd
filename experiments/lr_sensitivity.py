r"""LR sensitivity and attention-logit growth (Wortsman et al. 2023, "Small-scale proxies").

  python -m scale_ablation.sweep --config=experiments/lr_sensitivity.py:quick --workdir=runs/lr_quick

A log-spaced learning-rate grid × policies × d_k. The report gives, per policy and d_k, their
LR-sensitivity metric E_lr[min(loss(lr), loss_init) − min_lr loss(lr)] (loss_init is the
validation loss at step 0) and each run's max attention logit over training (summary.csv,
`max_attention_logit`), the growth that QK-LayerNorm is meant to prevent.
"""

import numpy as np

from experiments import base

POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "qk_layernorm")


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg)
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("lr_sensitivity",)
    config.train.diag_every = 20 if arg == "quick" else 100  # logit growth needs a time series
    if arg == "quick":
        config.train.steps = 100
    return config


def sweep(arg: str | None = None) -> list[dict]:
    quick = arg == "quick"
    lrs = np.logspace(-3.5, -0.5, 4 if quick else 7)  # 3e-4 .. 3e-1
    head_dims = (64,) if quick else (64, 256)
    return [
        {"policy": policy, "model.head_dim": head_dim, "train.lr": float(f"{lr:.3g}")}
        for policy in POLICIES
        for head_dim in head_dims
        for lr in lrs
    ]
