r"""Learning-rate transfer across width under u-μP beside μP (Blake et al. 2024, "u-μP: The
Unit-Scaled Maximal Update Parametrization"; issue 55 item 3), for u-μP's own attention scale
(mult/d_head at the unit-scaling package's mult 1: `inv_dk`) and 1/√d_k.

  python -m scale_ablation.sweep --config=experiments/umup_transfer.py:cpu \
      --workdir=runs/umup_transfer_cpu --refine
  python -m scale_ablation.coord_check --config=experiments/umup_transfer.py:cpu \
      --widths=64,128,256,512 --steps=10 --seeds=3 --parametrizations=umup,umup:inv_sqrt_dk \
      --config.train.lr=0.5 --out=runs/umup_transfer_cpu/coord_umup
  python -m scale_ablation.coord_check --config=experiments/umup_transfer.py:cpu \
      --widths=64,128,256,512 --steps=10 --seeds=3 --parametrizations=mup \
      --config.train.lr=0.01 --out=runs/umup_transfer_cpu/coord_mup

(two coordinate checks: one learning rate per command, and u-μP's η is on another scale than
μP's: its rules are absolute, a hidden weight's Adam step η/√fan_in on an N(0, 1) weight.)

The model and widths are mup_transfer's (width w: d_model = w, 4 heads of w/4, so d_k grows with
the width; μP's base is the smallest width, where μP is SP). u-μP has no base model
(model/umup.py): its multipliers are absolute at every width. The settings: μP with its own
`mup_inv_dk:<base d_k>` (experiments/results/mup_transfer_cpu found it to transfer, best LR
8.4e-3 to 9.9e-3), u-μP with its own `inv_dk`, and u-μP with 1/√d_k. Each (setting, width)
runs a ×2 LR grid × seeds; the question is whether the located best LR stays within one grid
step across widths (`scale_ablation.analysis.transfer`), and whether u-μP's holds as μP's does.

Variants: `cpu` (2 cores: widths 64-256, 4 heads, 2 layers, 300 steps of 16 × 128 bytes as
mup_transfer's cpu; μP 5 LRs 2e-3..3.2e-2 around its published optimum, u-μP 7 LRs 1/16..4
around the optimum a pilot located at width 64 (`UMUP_LRS`); 3 settings × 3 widths × 2 seeds:
114 runs in 6 programs; `--plan` on the shared 2-core VM for those 114: 3.34e14 train FLOPs
(widths 64, 128, 256: 2.0e13, 6.8e13, 2.46e14; +1.5e12 evaluation), 1.14 device-hours at the
planner's 40% of the 205 GFLOP/s matmul it measured (4,108 s); the pilot's 10 runs took 114 s
against its 70 s, so ~1.9 h under the usual load), default (one accelerator: widths
256-2048, 8 heads, 4 layers, 2000 steps, 3 seeds) and `quick` (tests: widths 32 and 64, 2 LRs
per setting, 1 seed, 10 steps: 12 runs).

Published: experiments/results/umup_transfer_cpu (150 runs after `--refine`'s one round, 1.54 h
summed over its ensembles) and the coordinate checks above
(experiments/results/umup_coord_check_cpu). Seeds 2-4 of the two u-μP settings (`MORE_SEEDS`)
add 126 runs at the grid's LRs and, through `--refine`'s seed fill, 36 at the 12 LRs its round
added: ~1.7 h more at the first 150's rate.
"""

from experiments import base, mup_transfer
from scale_ablation.analysis import claims as claims_lib
from scale_ablation.analysis import transfer

# (parametrisation, policy); μP's policy gets the base head dim (`policy_spec`).
SETTINGS = (("mup", "mup_inv_dk"), ("umup", "inv_dk"), ("umup", "inv_sqrt_dk"))
SEEDS = {"quick": (0,), "cpu": (0, 1), None: base.ACCELERATOR_SEEDS}
# Seeds 2-4 of the two u-μP settings: at two seeds their intervals spanned ×2.21 and ×2.44
# against the ×2 margin (experiments/results/umup_transfer_cpu), as mup_transfer's μP with
# 1/√d_k did (×2.09) until five seeds decided it (×1.69).
MORE_SEEDS = {"cpu": (2, 3, 4)}
# (widths, heads): mup_transfer's, whose config this study takes.
SIZES = {arg: (*mup_transfer.SIZES[arg][:2], SEEDS[arg]) for arg in SEEDS}
# μP's grid: ×2 around the best LR mup_transfer_cpu located (8.4e-3 to 9.9e-3) at this shape.
MUP_LRS = {"quick": (4e-3, 8e-3), "cpu": tuple(2e-3 * 2**k for k in range(5)),
           None: tuple(2.5e-4 * 2**k for k in range(8))}
# u-μP's grid: ×2 from 1/16 to 4 around its best at width 64. A pilot (u-μP with inv_dk at the
# cpu shape, width 64, seed 0, LRs 2^-6..2^3, 114 s for the 10 runs on the shared 2-core VM) ended
# at 4.31, 3.81, 3.64, 3.53, 3.42, 3.40, 3.53, 3.66, 3.96 and 4.17 bits per byte: best between
# 1/4 and 1/2, flanked by 1/8 and 1 at +0.12; μP's best runs at this shape end 3.14-3.38.
UMUP_LRS = {"quick": (0.25, 0.5), "cpu": tuple(2.0 ** k for k in range(-4, 3)),
            None: tuple(2.0 ** k for k in range(-6, 3))}


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    # mup_transfer's model, widths, data and schedule: the arms alone differ (`sweep`).
    config = mup_transfer.get_config(arg)
    config.wandb.tags = ("umup_transfer",)
    return config


policy_spec = mup_transfer.policy_spec  # μP's policy at the base head dim of the same widths


def lrs(parametrization: str, arg: str | None) -> tuple[float, ...]:
    grid = (UMUP_LRS if parametrization == "umup" else MUP_LRS)[arg]
    return tuple(float(f"{lr:.3g}") for lr in grid)


def seeds_of(parametrization: str, arg: str | None) -> tuple[int, ...]:
    """Every setting's seeds, and u-μP's extra ones (`MORE_SEEDS`)."""
    _, _, seeds = SIZES[arg]
    return seeds + (MORE_SEEDS.get(arg, ()) if parametrization == "umup" else ())


def sweep(arg: str | None = None) -> list[dict]:
    widths, heads, _ = SIZES[arg]
    return [
        {"model.parametrization": parametrization, "policy": policy_spec(policy, arg),
         "model.d_model": width, "model.head_dim": width // heads, "train.lr": lr,
         "train.seed": seed}
        for parametrization, policy in SETTINGS
        for width in widths
        for lr in lrs(parametrization, arg)
        for seed in seeds_of(parametrization, arg)
    ]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    """The transfer claims of this study (each judged by `transfer.Transfer.judge`)."""
    return [
        claims_lib.Claim("Under u-μP with its own attention scale (mult/d_head) the best "
                         "learning rate is the same at every width",
                         transfer.Transfer((("umup", "inv_dk"),), expect=True),
                         source="Blake et al. 2024"),
        claims_lib.Claim("Under μP with 1/d_k the best learning rate is the same at every width",
                         transfer.Transfer((("mup", policy_spec("mup_inv_dk", arg)),),
                                           expect=True),
                         source="Yang et al. 2022"),
        claims_lib.Claim("Under u-μP, 1/√d_k transfers too (as Lingle 2024 found under μP)",
                         transfer.Transfer((("umup", "inv_sqrt_dk"),), expect=True),
                         source="Lingle 2024"),
    ]
