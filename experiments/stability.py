r"""The article's "stability triangle": gradient clipping × warmup × attention dropout.

  python -m scale_ablation.sweep --config=experiments/stability.py:quick --workdir=runs/stability_quick

Each switch on and off, with 1/√d_k and with no scale, at a learning rate high enough that the
switches can matter.
"""

from experiments import base


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "gpu"))
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("stability",)
    config.train.lr = 1e-2 if arg == "quick" else 3e-3
    return config


def sweep(arg: str | None = None) -> list[dict]:
    config = get_config(arg)
    warmup = max(1, config.train.steps // 10)
    return [
        {"policy": policy, "train.grad_clip": clip, "train.warmup_steps": w,
         "model.attention_dropout": dropout, "model.head_dim": 256}
        for policy in ("inv_sqrt_dk", "none")
        for clip in (0.0, 1.0)
        for w in (0, warmup)
        for dropout in (0.0, 0.1)
    ]
