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
- default (one accelerator): the cpu study's five settings (gain 4) at d_k 64 and 256 (q/k
  width of 8 heads at d_model 512), each over 5 LRs ×2 apart around its cpu best, 3 seeds.
- `quick` (smoke test): gains 1 and 2 at d_k 64.

Budget (default): 3.51 device-hours on one H200, 150 runs, 4.97e18 train FLOPs
(`python -m scale_ablation.sweep --config=experiments/init_gain.py --workdir=DIR --plan
--device=H200`; FLOPs at the planner's assumed 40% MFU until a measured throughput table
exists, compilation not counted; tests/test_planner.py holds it to 25%).
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


# The default: the cpu study's five settings at gain 4, d_k 64 and (as the q/k width of 8 heads
# at d_model 512) 256, each over 5 LRs ×2 apart around its cpu best, 3 seeds.
ACCELERATOR_QK_DIMS = (64, 256)
ACCELERATOR_LRS = {"inv_sqrt_dk@1": 3e-3, "none": 1e-3, "inv_sqrt_dk": 1e-2, "gain_aware": 3e-2,
                   "const": 3e-2}


def accelerator_settings(head_dim: int) -> list[tuple[float, str, float]]:
    """(gain, policy, LR centre) of the default at `head_dim`: the cpu study's settings."""
    compensating = compensations(CPU_GAIN, head_dim)
    return [(1.0, "inv_sqrt_dk", ACCELERATOR_LRS["inv_sqrt_dk@1"]),
            (CPU_GAIN, "none", ACCELERATOR_LRS["none"]),
            (CPU_GAIN, "inv_sqrt_dk", ACCELERATOR_LRS["inv_sqrt_dk"]),
            (CPU_GAIN, compensating[1], ACCELERATOR_LRS["gain_aware"]),
            (CPU_GAIN, compensating[2], ACCELERATOR_LRS["const"])]


def sweep(arg: str | None = None) -> list[dict]:
    if arg is None:
        return [{"model.init_gain": gain, "policy": policy, "model.qk_dim": qk_dim,
                 "train.lr": lr, "train.seed": seed}
                for qk_dim in ACCELERATOR_QK_DIMS
                for gain, policy, centre in accelerator_settings(qk_dim)
                for lr in base.lr_grid_around(centre) for seed in base.ACCELERATOR_SEEDS]
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
    # quick runs one LR and one seed: its comparisons stay inconclusive.
    at = "each_lr" if arg == "quick" else "best_lr"
    gain = 2.0 if arg == "quick" else CPU_GAIN
    head_dims = (CPU_HEAD_DIM,) if arg == "cpu" else ACCELERATOR_QK_DIMS
    compensating = tuple(dict.fromkeys(spec for d in head_dims
                                       for spec in compensations(gain, d)[1:]))
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
    if arg != "quick":  # quick runs the compensations at gain 1 too, and no scale 1
        found.append(claims_lib.Claim(
            f"The scale must compensate: at gain {gain:g}, 1/(g²√d_k) and the article's "
            "1/(g√d_k) end better than 1/√d_k",
            claims_lib.Compare("better", policies=compensating), source="article §5.1, pitfall 1"))
        found.append(claims_lib.Claim(
            f"At gain {gain:g} scale 1 diverges or oscillates at every learning rate",
            claims_lib.Unstable(("none",), expect_unstable=True), source="article §1, §5.1"))
        # Claim 2 pools both gains, so the gain-1 runs alone can support it; the article's own
        # claim is that a wrong init gain makes the scale fail (§5.1: "导致scale失效").
        # Added after the 93-run rerun: the taxonomy that judges it was fixed before it.
        found.append(claims_lib.Claim(
            f"At gain {gain:g}, 1/√d_k no longer trains smoothly at any learning rate",
            claims_lib.Arms(claims_lib.Unstable((str(float(gain)),), expect_unstable=True),
                            field="model.init_gain", policies=("inv_sqrt_dk",)),
            source="article §5.1, pitfall 1"))
    return found
