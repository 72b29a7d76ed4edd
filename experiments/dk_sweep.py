r"""The central ablation: scale policies × d_k at a fixed model width (article claim 3).

  python -m scale_ablation.sweep --config=experiments/dk_sweep.py:quick --workdir=runs/dk_sweep_quick
  python -m scale_ablation.sweep --config=experiments/dk_sweep.py --workdir=runs/dk_sweep

The article says every scale but 1/√d_k diverged or oscillated within 500 steps. Here each
policy trains at d_k ∈ {16, 64, 256, 1024} with num_heads × head_dim decoupled from d_model, and
the report gives final validation bits per byte, the divergence step and attention diagnostics.
`quick` (one seed, 64 runs) fits a 2-core CPU; the default is sized for one GPU.
A policy of your own joins the grid at every d_k with no edit here (README, "Add your policy and
sweep it"): add `--imports=my_policy.py --add_policies=my_policy` to the sweep command.

The init is an axis too (`model.init`, one table row per policy and init): which scale is best
depends on how q and k start (the article's pitfall 1). `fan_in` gives q and k unit-variance
entries at every d_k, the article's premise; `gpt2` (std 0.02) gives entries of std
0.02·√d_model, so 1/√d_k logits start with std 0.02²·d_model instead of 1 (0.03 at the quick
d_model 64, 0.2 at 512), as in the GPT-2-style models most results are quoted for. To drop
the axis, set INITS to one of them.
"""

from experiments import base
from scale_ablation import claims as claims_lib

OTHER_SCALES = ("none", "inv_dk", "inv_log_dk", "const:0.1")  # the article's §1 alternatives
POLICIES = ("inv_sqrt_dk", "none", "inv_dk", "inv_log_dk", "const:0.1", "learned", "qk_layernorm",
            "log_length")
HEAD_DIMS = (16, 64, 256, 1024)
INITS = ("fan_in", "gpt2")  # model.init: the article's unit-variance q/k, and GPT-2's


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg)
    config = base.get_config("gpu" if arg != "quick" else "quick")
    config.model.num_heads = 2 if arg == "quick" else 4
    config.wandb.tags = ("dk_sweep",)
    if arg == "quick":
        config.train.steps = 120
        config.train.warmup_steps = 12
        config.train.log_every = 20
        config.train.eval_every = 20
        config.train.diag_every = 40
        config.checkpoint.every = 60
    else:
        config.train.steps = 3000
    return config


def sweep(arg: str | None = None) -> list[dict]:
    seeds = (0,) if arg == "quick" else (0, 1, 2)
    return [
        {"policy": policy, "model.head_dim": head_dim, "model.init": init, "train.seed": seed}
        for init in INITS
        for policy in POLICIES
        for head_dim in HEAD_DIMS
        for seed in seeds
    ]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    # One learning rate here: lr_sensitivity.py compares the policies each at its best LR.
    return [
        claims_lib.Claim(
            "Scale 1, 1/d_k, 1/log d_k and a fixed 0.1 diverged or oscillated; only 1/√d_k "
            "trained smoothly (at large d_k)",
            claims_lib.Unstable(OTHER_SCALES, expect_unstable=True, min_d_k=256),
            source="article §1"),
        claims_lib.Claim(
            "At large d_k every other scale ends worse than 1/√d_k",
            claims_lib.Compare("worse", policies=OTHER_SCALES, at="each_lr", min_d_k=256),
            source="article §1"),
    ]
