r"""The earlier main job, kept as the worked example of a verdict decided at init: at one wide
head (d_k 128, fan_in init), scale 1 ends worse than 1/√d_k.

  python -m scale_ablation.sweep --config=experiments/scale_one_fan_in.py \
      --workdir=runs/scale_one_fan_in
  (`:quick`: the same grid for a few steps, a smoke test)

Under fan_in, q and k have unit-variance entries, so scale 1 starts with a logit std of
√128 ≈ 11 and a near one-hot attention (normalised entropy 0.16 at step 0): its three runs never
learn, and both verdicts were known before the first step (`analysis/at_init.py` marks them
"decided at init"). The main job (`experiments/headline.py`) now asks the question where it is
open, under gpt2 init.

Design: the base `cpu` model (2 layers, d_model 128) with one head of d_k 128, three seeds,
1/√d_k at LR 3e-3 and scale 1 at 1e-3: the interior bests of a 4-point grid that the published
d_k study located for this very cell at 600 steps (`experiments/results/dk_sweep_cpu`, 1 × 128).
The six runs train as one ensemble and the claims compare each policy at its LR, paired by seed;
a 64 KiB test split reports (standard error ~0.01 bits per byte), validation chose.
Why 500 steps and no 1/d_k arm: the five-minute budget (issue 33). Idle on 2 cores, the six runs
at 600 steps took 5 min 0.7 s cold and the nine with 1/d_k ~7.5 min; 500 steps keep a margin. The
LRs were located at 600 steps, so here they are near-located (a schedule 1/6 shorter), which
matters little beside a gap of ~0.7 bits per byte; 1/d_k against 1/√d_k was unresolved in this
cell (−0.07 ± 0.17, n = 3; no equivalence test), and `experiments/mup_transfer.py` asks μP's.
It is one cell of one study, so its verdicts are about this cell only; the studies that vary
d_k, width and the LR are the `:cpu` variants of the other experiment files.
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib

LOCATED_LRS = {"inv_sqrt_dk": 3e-3, "none": 1e-3}  # dk_sweep_cpu, 1 head × 128, 600 steps
SEEDS = (0, 1, 2)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick",))
    config = base.get_config("cpu")
    config.model.num_heads = 1
    config.model.head_dim = 128
    config.wandb.tags = ("headline",)  # as its published runs were made (as the main job)
    config.train.steps, config.train.diag_every = 500, 100
    config.data.test_bytes = 64 * 1024
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
        claims_lib.Claim("Scale 1 does not train smoothly at d_k 128",
                         claims_lib.Unstable(("none",), expect_unstable=True),
                         source="article §1"),
    ]
