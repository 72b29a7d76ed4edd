r"""Does a learned scale converge to ≈1/√d_k, as the article's §5.3 claims?

  python -m scale_ablation.sweep --config=experiments/learned_scale.py:quick --workdir=runs/learned_quick

The learnable scale starts at 1/√d_k (and, to see whether it is an attractor rather than just
the starting point, also at 1 and at 1/d_k); diagnostics log its value per layer
(`attn/layer{i}/learned_scale`) through training, and the report plots the final value against
1/√d_k.
"""

from experiments import base

HEAD_DIMS = (16, 64, 256, 1024)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "gpu"))
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("learned_scale",)
    config.train.diag_every = 20 if arg == "quick" else 100
    if arg == "quick":
        config.train.steps = 150
    return config


def sweep(arg: str | None = None) -> list[dict]:
    head_dims = (16, 64, 256) if arg == "quick" else HEAD_DIMS
    points = []
    for head_dim in head_dims:
        for spec in ("learned", "learned_per_head", "learned:1.0", f"learned:{1 / head_dim:.6g}"):
            points.append({"policy": spec, "model.head_dim": head_dim})
    return points
