r"""The article's central claim in about five minutes on 2 cores: at one wide head (d_k 128),
scale 1 ends worse than 1/√d_k, and 1/d_k is compared too.

  bash launch/local.sh experiments/headline.py runs/headline        # the README's first command
  python -m scale_ablation.sweep --config=experiments/headline.py --workdir=runs/headline
  (`:quick`: the same grid for a few steps, a smoke test)

Design: the base `cpu` model (2 layers, d_model 128) with one head of d_k 128, 600 steps, three
seeds; each policy at the learning rate the published d_k study located for this very cell
(`experiments/results/dk_sweep_cpu`, 1 × 128: 1/√d_k 3e-3, 1/d_k 3e-3, scale 1 1e-3, each the
interior best of a 4-point grid), so the nine runs train as one ensemble and the claims compare
each policy at its own located LR, paired by seed. A test split reports; validation chose.
It is one cell of one study, so its verdicts are about this cell only; the studies that vary
d_k, width and the LR are the `:cpu` variants of the other experiment files.
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib

LOCATED_LRS = {"inv_sqrt_dk": 3e-3, "inv_dk": 3e-3, "none": 1e-3}  # dk_sweep_cpu, 1 head × 128
SEEDS = (0, 1, 2)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick",))
    config = base.get_config("cpu")
    config.model.num_heads = 1
    config.model.head_dim = 128
    config.wandb.tags = ("headline",)
    if arg == "quick":  # the tests' smoke variant: the same grid, a few steps
        quick = base.get_config("quick")
        config.train, config.checkpoint, config.data = quick.train, quick.checkpoint, quick.data
    return config


def sweep(arg: str | None = None) -> list[dict]:
    return [{"policy": policy, "train.lr": lr, "train.seed": seed}
            for policy, lr in LOCATED_LRS.items() for seed in SEEDS]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    return [
        claims_lib.Claim("Without the divisor (scale 1) training ends worse than with 1/√d_k",
                         claims_lib.Compare("worse", policies=("none",), at="own_lr"),
                         source="article §1"),
        claims_lib.Claim("1/d_k ends worse than 1/√d_k",
                         claims_lib.Compare("worse", policies=("inv_dk",), at="own_lr"),
                         source="article §1"),
        claims_lib.Claim("Scale 1 does not train smoothly at d_k 128",
                         claims_lib.Unstable(("none",), expect_unstable=True),
                         source="article §1"),
    ]
