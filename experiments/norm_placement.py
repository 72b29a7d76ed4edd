r"""Pitfall 2: where normalisation sits. Pre-norm vs post-norm blocks vs LayerNorm on the logits.

  python -m scale_ablation.sweep --config=experiments/norm_placement.py:quick --workdir=runs/norm_quick

`logit_layernorm` normalises q·k over the visible keys before the 1/√d_k divisor, which the
article says over-normalises (post-scale logit std ≈ 1/√d_k instead of 1).
"""

from experiments import base

VARIANTS = (
    {"model.norm_position": "pre", "policy": "inv_sqrt_dk"},
    {"model.norm_position": "post", "policy": "inv_sqrt_dk"},
    {"model.norm_position": "pre", "policy": "logit_layernorm"},
    {"model.norm_position": "post", "policy": "logit_layernorm"},
)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "gpu"))
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("norm_placement",)
    return config


def sweep(arg: str | None = None) -> list[dict]:
    head_dims = (16, 256) if arg == "quick" else (16, 64, 256, 1024)
    return [{**variant, "model.head_dim": d} for variant in VARIANTS for d in head_dims]
