r"""The main job: does the divisor matter where the answer is not decided at init? Under gpt2 init
at d_k 16, 1/√d_k against 1/d_k (μP) and scale 1, each at its own located learning rate.

  bash launch/local.sh experiments/headline.py runs/headline        # the README's first command
  python -m scale_ablation.sweep --config=experiments/headline.py --workdir=runs/headline
  (`:quick`: the same grid for a few steps, a smoke test)

Why this question (issue 54). The article's §1 says scale 1 trains worse than 1/√d_k. Where the
earlier main job asked it (fan_in, d_k 128: `experiments/scale_one_fan_in.py`) scale 1 starts with
a logit std of √128 ≈ 11 and a one-hot attention, so its verdict was decided at init
(`analysis/at_init.py`). Under gpt2 init (weights of std 0.02) every scale starts with small
logits and near-uniform attention, and which divisor trains best is an open question: in
dk_exponent_cpu the best C/√d_k at d_k 16 under gpt2 was 4–8, i.e. scale 1 or more, while 1/d_k
(C = 1/4) sat on the other side of 1/√d_k.

Design: dk_exponent's `cpu` configuration exactly (d_model 128, 2 layers, 4 heads of value width
32, 400 steps × 16 × 64 bytes, reference attention path) with q/k width 16 and gpt2 init, the cell
whose LRs were located there; three policies × three seeds, each policy at its located LR
(`LOCATED_LRS`: the vertex of the parabola through each policy's best LR and its neighbours on
validation, `analysis/located.py`; tests/test_published.py computes them again from
dk_exponent_cpu's summary.csv). The nine runs are scalar policies of one shape: one vmapped
ensemble, one program. Validation is evaluated halfway and at the end; a 64 KiB test split
(standard error ~0.01 bits per byte) reports, validation chose.

Claims: the article's "scale 1 ends worse" (a paired test at own LRs), and "1/d_k costs nothing
against 1/√d_k" within ±0.02 bits per byte (two one-sided tests). Neither is known at step 0:
each claim's lines give every arm's attention entropy and logit std there. One cell of one
study: its verdicts are about this cell; dk_exponent_cpu asks the question over d_k and C.
"""

from experiments import base, dk_exponent
from scale_ablation.analysis import claims as claims_lib

QK_DIM, INIT = 16, "gpt2"
# Located in dk_exponent_cpu (gpt2, q/k 16, 400 steps; validation): 1/d_k is C = 1/4 there and
# scale 1 is C = 4 (C/√16).
LOCATED_LRS = {"inv_sqrt_dk": 2.7e-3, "inv_dk": 3.9e-3, "none": 2.0e-3}
SOURCE_POLICY = {"inv_sqrt_dk": "inv_sqrt_dk", "inv_dk": "c_inv_sqrt_dk:0.25",
                 "none": "c_inv_sqrt_dk:4"}  # the name each policy has in dk_exponent_cpu
SEEDS = (0, 1, 2)
MARGIN = 0.02  # bits per byte: dk_exponent's ScaleCost margin, below its seed noise (~0.027)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick",))
    config = dk_exponent.get_config("quick" if arg == "quick" else "cpu")
    config.model.qk_dim, config.model.init = QK_DIM, INIT
    config.wandb.tags = ("headline",)
    if arg != "quick":
        config.data.test_bytes = 64 * 1024
    return config


def sweep(arg: str | None = None) -> list[dict]:
    return [{"policy": policy, "train.lr": lr, "train.seed": seed}
            for policy, lr in LOCATED_LRS.items() for seed in SEEDS]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    return [
        claims_lib.Claim(
            "Without the divisor (scale 1) training ends worse than with 1/√d_k (gpt2 init, "
            "d_k 16)", claims_lib.Compare("worse", policies=("none",), at="own_lr"),
            source="article §1"),
        claims_lib.Claim(
            f"1/d_k ends within {MARGIN} bits per byte of 1/√d_k (gpt2 init, d_k 16)",
            claims_lib.Compare("indistinguishable", policies=("inv_dk",), at="own_lr",
                               margin=MARGIN), source="Yang et al. 2022"),
    ]
