r"""Pitfall 1: a q/k projection init gain breaks the variance argument; can the scale undo it?

  python -m scale_ablation.sweep --config=experiments/init_gain.py:quick --workdir=runs/init_gain_quick

Xavier gain g on W_Q and W_K multiplies Var(q·k) by g⁴ (not g²), so the compensating scale is
1/(g²√d_k) (`gain_aware:g`), not the article's 1/(g√d_k). Compare both with plain 1/√d_k.
`experiments/variance_probe.py` measures the same thing at initialisation without training.
"""

from experiments import base


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "gpu"))
    config = base.get_config("quick" if arg == "quick" else "gpu")
    config.wandb.tags = ("init_gain",)
    return config


def sweep(arg: str | None = None) -> list[dict]:
    head_dims = (64,) if arg == "quick" else (64, 256)
    return [
        {"model.init_gain": gain, "policy": policy, "model.head_dim": head_dim}
        for gain in (1.0, 2.0)
        for head_dim in head_dims
        # The article's suggested compensation for gain 2, 1/(2√d_k), as a constant.
        for policy in ("inv_sqrt_dk", "gain_aware:2", f"const:{1 / (2 * head_dim**0.5):.6g}")
    ]
