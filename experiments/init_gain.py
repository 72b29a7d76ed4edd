r"""Pitfall 1: a q/k projection init gain breaks the variance argument; can the scale undo it?

  python -m scale_ablation.sweep --config=experiments/init_gain.py:cpu --workdir=runs/init_gain_cpu

Xavier gain g on W_Q and W_K multiplies Var(q·k) by g⁴ (not g²), so the compensating scale is
1/(g²√d_k) (`gain_aware:g`), not the article's 1/(g√d_k). Compare both with plain 1/√d_k.
`experiments/variance_probe.py` measures the same thing at initialisation without training.

Variants:
- `cpu` (the study for 2 cores): the base CPU model (4 heads × d_k 32, 600 steps) with gain
  g = 4, where 1/√d_k starts with logits of std g² = 16 instead of 1 (scale 1: 16·√32 ≈ 90):
  1/√d_k, scale 1, 1/(g²√d_k) and the article's 1/(g√d_k), plus 1/√d_k at gain 1 as the
  unbroken reference; 5 settings × LR {1e-3, 3e-3, 1e-2} × 3 seeds = 45 runs (35 minutes on 2
  cores), and 3e-2, 1e-1 for the three gain-4 settings other than scale 1, whose best LR sat on
  1e-2 (18 runs). One large gain rather than a gain axis: g = 2 moves the 1/√d_k logits only to
  std 4, and a second gain would double the grid past the hour.
- default (one accelerator): gains 1 and 2 × d_k 64 and 256, one seed at one LR.
- `quick` (smoke test): gains 1 and 2 at d_k 64.
"""

from experiments import base
from scale_ablation.analysis import claims as claims_lib

CPU_GAIN, CPU_HEAD_DIM = 4.0, 32
CPU_LRS = (1e-3, 3e-3, 1e-2)


def get_config(arg: str | None = None):
    base.check_variant(__file__, arg, ("quick", "cpu"))
    config = base.get_config({None: "gpu"}.get(arg, arg))
    config.wandb.tags = ("init_gain",)
    return config


def compensations(gain: float, head_dim: int) -> tuple[str, ...]:
    """1/√d_k, 1/(g²√d_k), and the article's suggested 1/(g√d_k) as a constant."""
    return ("inv_sqrt_dk", f"gain_aware:{gain:g}", f"const:{1 / (gain * head_dim**0.5):.6g}")


# At gain 4 every setting but scale 1 had its best LR on 1e-2, the grid's top, in the first
# pass: larger q/k weights move relatively less per Adam step, so their best LR sits higher.
WIDER = {(CPU_GAIN, policy): (3e-2, 1e-1) for policy in compensations(CPU_GAIN, CPU_HEAD_DIM)}


def sweep(arg: str | None = None) -> list[dict]:
    if arg == "cpu":
        settings = [(1.0, "inv_sqrt_dk")] + [
            (CPU_GAIN, p) for p in ("none", *compensations(CPU_GAIN, CPU_HEAD_DIM))]
        return [{"model.init_gain": gain, "policy": policy, "model.head_dim": CPU_HEAD_DIM,
                 "train.lr": lr, "train.seed": seed}
                for gain, policy in settings
                for lr in base.lr_grid_for((gain, policy), CPU_LRS, WIDER)
                for seed in (0, 1, 2)]
    head_dims = (64,) if arg == "quick" else (64, 256)
    return [
        {"model.init_gain": gain, "policy": policy, "model.head_dim": head_dim}
        for gain in (1.0, 2.0)
        for head_dim in head_dims
        for policy in compensations(2.0, head_dim)
    ]


def claims(arg: str | None = None) -> list[claims_lib.Claim]:
    # quick and the default run one LR and one seed: their comparisons stay inconclusive.
    at = "best_lr" if arg == "cpu" else "each_lr"
    gain = CPU_GAIN if arg == "cpu" else 2.0
    compensating = compensations(gain, CPU_HEAD_DIM)[1:]
    found = [
        claims_lib.Claim(
            f"Changing the q/k init gain breaks the variance argument: at gain {gain:g}, "
            "1/√d_k ends worse than at gain 1",
            claims_lib.Arms(claims_lib.Compare("worse", policies=(str(float(gain)),),
                                               reference="1.0", at=at),
                            field="model.init_gain", policies=("inv_sqrt_dk",)),
            source="article §5.1, pitfall 1"),
        claims_lib.Claim(
            f"1/√d_k still trains smoothly at some learning rate (its runs at gain 1 and gain "
            f"{gain:g} together)",
            claims_lib.Unstable(("inv_sqrt_dk",), expect_unstable=False),
            source="article §5.1"),
    ]
    if arg == "cpu":  # the other grids run the compensations at gain 1 too, and no scale 1
        found.append(claims_lib.Claim(
            f"The scale must compensate: at gain {gain:g}, 1/(g²√d_k) and the article's "
            "1/(g√d_k) end better than 1/√d_k",
            claims_lib.Compare("better", policies=compensating), source="article §5.1, pitfall 1"))
        found.append(claims_lib.Claim(
            f"At gain {gain:g} scale 1 diverges or oscillates at every learning rate",
            claims_lib.Unstable(("none",), expect_unstable=True), source="article §1, §5.1"))
    return found
