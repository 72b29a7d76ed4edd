r"""Pitfall 3: logits in low precision. Does the unscaled run overflow, and do float32 logits cure it?

  python -m scale_ablation.sweep --config=experiments/precision.py:quick --workdir=runs/precision_quick

Compute dtype float32 / bfloat16 / float16 × logits kept in float32 or in the activation dtype ×
`none` vs `inv_sqrt_dk`, at large d_k. float16 overflows above 65504; bfloat16 has float32's
range but 8 bits of mantissa. (float32 compute with "activation" logits is the same as float32
logits, so it is left out.) float16 runs use no loss scaling: that is part of what is measured.
"""

from experiments import base


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "gpu"))
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("precision",)
    return config


def sweep(arg: str | None = None) -> list[dict]:
    head_dims = (256,) if arg == "quick" else (256, 1024)
    points = []
    for dtype in ("float32", "bfloat16", "float16"):
        for logits_dtype in ("float32", "activation"):
            if dtype == "float32" and logits_dtype == "activation":
                continue
            for policy in ("none", "inv_sqrt_dk"):
                for head_dim in head_dims:
                    points.append({"train.dtype": dtype, "model.logits_dtype": logits_dtype,
                                   "policy": policy, "model.head_dim": head_dim})
    return points
